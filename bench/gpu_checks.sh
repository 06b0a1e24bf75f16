#!/usr/bin/env bash
# The README's GPU checks in one run, on a machine with a CUDA GPU and torch (the server stack not needed):
# the collector's GPU tests, its overhead on one device, a DDP job written from the docs run on the GPU
# and the same with FSDP2 (each collected into a spool and profiled by torch.profiler), the published runs' GEMMs and
# attention timed for the planner (PLANNER_GPU: the planner's name for the GPU, for its peaks; default H200), one
# context-parallel rank's attention as torch schedules it (cp_attention.csv), which kernel each of torchtitan's
# attention backends runs, and a
# Flight Recorder dump from NCCL. Everything
# lands in $OUT (default /tmp/gpu-checks): log.txt, gpu-tests.xml, kernels.json and results.tgz (the spool, the trace,
# the dumps), which the machine without a GPU then reads (docs/benchmarks.md, "GPU checks", says how).
#
#     bash bench/gpu_checks.sh
set -u
out=${OUT:-/tmp/gpu-checks}
mkdir -p "$out/work"
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $* ($(date +%T))"; }
{
    step "device"
    nvidia-smi -L
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
    step "install (README's GPU checks)"
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
    python3 -c "from bubblescope.collector import gpu_timing; print('collector from', gpu_timing.__file__)"
    step "GPU tests"
    timeout 300 python3 -m pytest --noconftest -p no:cacheprovider -o addopts="" -q -rs --junitxml="$out/gpu-tests.xml" \
        tests/collector/test_gpu_timing.py tests/collector/test_gpu_comm_timing.py tests/collector/test_gpu_memory.py \
        tests/collector/test_gpu_timing_fallback.py
    step "overhead on one device, defaults"
    timeout 150 python3 bench/collector_overhead_one_device.py --device cuda
    step "overhead on one device, full spans"
    timeout 150 python3 bench/collector_overhead_one_device.py --device cuda --full
    step "DDP from the docs on the GPU: collected (spooled) and profiled"
    BUBBLESCOPE_SPOOL_DIR="$out/work/spool" timeout 150 torchrun --standalone --nproc-per-node 1 \
        bench/ddp_from_docs.py --run-name gpu-ddp-docs --cuda --hidden 4096 --steps 40 --trace-dir "$out/work/trace"
    step "FSDP2 from the docs on the GPU: collected (spooled) and profiled"
    BUBBLESCOPE_SPOOL_DIR="$out/work/spool" timeout 150 torchrun --standalone --nproc-per-node 1 \
        bench/ddp_from_docs.py --run-name gpu-fsdp2-docs --cuda --fsdp2 --hidden 4096 --steps 40 --trace-dir "$out/work/trace-fsdp2"
    step "the planner's GEMMs and attention on this GPU (published runs' shapes)"
    timeout 240 python3 bench/gpu_kernel_efficiency.py --gpu "${PLANNER_GPU:-H200}" --json "$out/kernels.json"
    step "context parallelism's attention: one rank's blocks as torch schedules them (torchtitan's long-sequence rows)"
    timeout 150 python3 bench/gpu_cp_attention.py --csv "$out/cp_attention.csv"
    step "which fused attention each of torchtitan's attention backends runs, and how fast"
    timeout 330 python3 bench/gpu_attention_backends.py
    step "Flight Recorder from NCCL"
    TORCH_FR_BUFFER_SIZE=100 timeout 60 python3 bench/gpu_fr_dump.py "$out/work/fr"
    step "done"
} 2>&1 | tee "$out/log.txt"
tar czf "$out/results.tgz" -C "$out/work" . && rm -rf "$out/work"
ls -la "$out"
