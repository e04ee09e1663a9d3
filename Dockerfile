# The workbook on NVIDIA's PyTorch container (CUDA, cuDNN, NCCL and a torch build tuned for them).
#   docker build -t workbook .
#   docker run --gpus all --ipc=host -v "$PWD/runs:/workbook/runs" workbook                  # make workbook
#   docker run --gpus all --ipc=host -v "$PWD/docs/results:/workbook/docs/results" workbook scripts/gpu_check.sh
# --ipc=host: DataLoader workers pass batches through shared memory, which Docker limits to 64 MB.
# The 25.12 release ships Python 3.12 and PyTorch 2.10.0a0 on CUDA 13.1 (an R580 driver or newer): its pins,
# with the release notes they come from, are in containers/pins/ngc-pytorch-25.12.txt, and
# tests/test_containers.py asks pip to resolve the project's dependencies against them.
ARG NGC_TAG=25.12
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}-py3
LABEL org.opencontainers.image.title="fast-cnn-workbook" \
      workbook.base.pins="containers/pins/ngc-pytorch-25.12.txt"

WORKDIR /workbook
COPY . .
# The project's own install (`make venv`: python -m venv, then pip install -e '.[dev]' and the kernel),
# into /opt/venv so that a checkout bound over /workbook does not hide it. NGC images pin their torch build
# (/etc/pip/constraint.txt), and --system-site-packages lets the venv see it, so pip keeps it. EXTRAS=dev
# leaves out the compress extra (torchao needs torch >= 2.11): notebook 13 then says in one line that its
# PT2E int8 rows are left out.
RUN make venv VENV=/opt/venv VENV_FLAGS=--system-site-packages EXTRAS=dev
ENV PATH=/opt/venv/bin:$PATH

# -o: never reinstall at run time (the image may be read-only, as under Apptainer).
CMD ["make", "-o", "/opt/venv/.installed", "workbook", "VENV=/opt/venv"]
