--[[
/etc/slurm/job_submit.lua for a site that already has a job_submit.lua of its own:
the site's rules first, then gpucredit's quote (docs/admin-guide.md §2, "A site's
own hooks"). Slurm loads one job_submit.lua, from the folder of slurm.conf; this one
loads the two scripts below, each in an environment of its own, so their globals
(slurm_job_submit above all) do not overwrite each other.

    mv /etc/slurm/job_submit.lua /etc/slurm/job_submit.site.lua
    gpucredit slurm install --job-submit-to /etc/slurm/gpucredit/job_submit.lua
    gpucredit example slurm/job_submit.lua > /etc/slurm/job_submit.lua

`gpucredit slurm install --job-submit-to` rewrites gpucredit's script and then dates
this file ahead, so that slurmctld (which watches only this file's mtime) loads both
again at the next submission. A job the site's rules refuse is never quoted.
--]]

local SITE = "/etc/slurm/job_submit.site.lua"
local GPUCREDIT = "/etc/slurm/gpucredit/job_submit.lua"

-- Run the script at `path` with globals of its own that fall back to slurmctld's
-- (slurm, require, ...); returns that environment, holding the functions it defined.
local function load_script(path)
    local env = setmetatable({}, { __index = _G })
    local chunk, err
    if setfenv then -- Lua 5.1 (Debian's Slurm)
        chunk, err = loadfile(path)
        if chunk then
            setfenv(chunk, env)
        end
    else -- Lua 5.2 and later
        chunk, err = loadfile(path, "t", env)
    end
    if not chunk then
        error(err)
    end
    chunk()
    return env
end

local site = load_script(SITE)
local gpucredit = load_script(GPUCREDIT)

function slurm_job_submit(job_desc, part_list, submit_uid)
    local rc = site.slurm_job_submit(job_desc, part_list, submit_uid)
    if rc ~= slurm.SUCCESS then
        return rc
    end
    return gpucredit.slurm_job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    local rc = site.slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    if rc ~= slurm.SUCCESS then
        return rc
    end
    return gpucredit.slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
