#!/bin/bash
# Multi-node DDP training with the workbook engine under SLURM.
#
# One torchrun per node (srun starts one task per node); each torchrun starts one worker per GPU,
# and the nodes find each other through torchrun's c10d rendezvous on the first node of the job.
# This is what `course_lib.engine.torchrun.launch(..., nnodes=2)` rehearses on one machine over 127.0.0.1.
# Each torchrun runs inside the project's Apptainer image (containers/workbook.def) with the
# checkout bound over /workbook; without the image it falls back to the checkout's .venv.
#
#   apptainer build workbook.sif containers/workbook.def   # once, from the project root
#   sbatch docs/slurm_example.sh                          # the gpu profile, 5 epochs
#   sbatch docs/slurm_example.sh -p model=resnet50 -p batch_size=96
#
# Results land in the project's ledger (runs/ledger.sqlite) with run id slurm-<job id>:
#   .venv/bin/workbook ledger --run slurm-<job id>
#
#SBATCH --job-name=workbook-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1            # one torchrun per node; torchrun starts the GPU workers
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32             # DataLoader workers + one intra-op thread pool per GPU
#SBATCH --time=02:00:00
#SBATCH --output=slurm-%j.out
set -euo pipefail

cd "${SLURM_SUBMIT_DIR:-.}"
GPUS_PER_NODE="${GPUS_PER_NODE:-4}"    # keep equal to --gpus-per-node above
RDZV_PORT="${RDZV_PORT:-29500}"        # any port free on the first node

WORKBOOK_SIF="${WORKBOOK_SIF:-workbook.sif}"  # the image `apptainer build` wrote
if [ -f "$WORKBOOK_SIF" ]; then
    # --nv: the host's NVIDIA driver inside the image; the bound checkout receives runs/ and the ledger.
    PYTHON=(apptainer exec --nv --bind "$PWD":/workbook --pwd /workbook "$WORKBOOK_SIF" /opt/venv/bin/python)
else
    PYTHON=(.venv/bin/python)
fi

# The first node hosts the rendezvous store; every torchrun connects to it.
HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"

# Threads per worker: the task's CPUs shared by its GPU workers (torchrun would otherwise pick 1).
export OMP_NUM_THREADS="$(( SLURM_CPUS_PER_TASK / GPUS_PER_NODE ))"
export WORKBOOK_RUN_ID="slurm-${SLURM_JOB_ID}"

# NCCL, from the articles' advice; uncomment what your fabric needs and compare efficiencies:
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # INFO prints the rings/trees and transports NCCL chose
# export NCCL_SOCKET_IFNAME=ib0          # the interface NCCL bootstraps over (not a docker/virtual one)
# export NCCL_IB_DISABLE=0               # 0: use InfiniBand/RoCE between nodes (1 forces TCP sockets)
# export NCCL_P2P_LEVEL=NVL              # inside a node: see `nvidia-smi topo -m` (NVL, PIX, PXB, SYS)
# export NCCL_BUFFSIZE=8388608           # bytes per channel buffer; larger can help slow links

# --kill-on-bad-exit: when one node's torchrun fails, stop the others instead of letting them wait.
srun --kill-on-bad-exit=1 "${PYTHON[@]}" -m torch.distributed.run \
    --nnodes "$SLURM_NNODES" \
    --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d \
    --rdzv-endpoint "${HEAD_NODE}:${RDZV_PORT}" \
    --rdzv-id "$SLURM_JOB_ID" \
    --max-restarts 0 \
    --tee 3 --log-dir "runs/ddp_logs/slurm-${SLURM_JOB_ID}" \
    --log-line-prefix-template '[${hostname} rank${rank}] ' \
    -m course_lib train --profile gpu --no-progress -p epochs=5 "$@"
