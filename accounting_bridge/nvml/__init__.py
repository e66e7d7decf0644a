"""`gpucredit agent`: one per GPU node; NVML samples become per-job-run GPU metrics
(allocated and busy GPU-seconds, memory, energy), never charges.

    agent      Agent (a tick: sample, attribute to the runs, add increments to gpu_usage),
               agent_command
    sampler    pure logic over an NVML module: sample_node, GpuRegistry (which run owns which
               GPU, from the node Prolog's files), UsageAccumulator
    nvml_fake  FakeNvml: pynvml's API, scriptable, for tests and GPU-less hosts (--fake-nvml)
"""
