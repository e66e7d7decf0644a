-- Pass-through job_submit.lua for the cluster in a box, TESTING ONLY: the box
-- installs it when gpucredit's own job_submit/job_submit.lua is absent or the
-- box runs with hooks=passthrough. It accepts every job unchanged.
function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
