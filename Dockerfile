# The workbook on NVIDIA's PyTorch container (CUDA, cuDNN, NCCL and a torch build tuned for them).
#   docker build -t workbook .
#   docker run --gpus all --ipc=host -v "$PWD/runs:/workbook/runs" workbook                  # make workbook
#   docker run --gpus all --ipc=host -v "$PWD/docs/results:/workbook/docs/results" workbook scripts/gpu_check.sh
# --ipc=host: DataLoader workers pass batches through shared memory, which Docker limits to 64 MB.
# The 25.01 release ships Ubuntu 24.04, Python 3.12 and PyTorch 2.6 (NGC release notes); the labels
# below say so, and tests/test_containers.py checks them against pyproject.toml.
ARG NGC_TAG=25.01
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}-py3
LABEL org.opencontainers.image.title="fast-cnn-workbook" \
      workbook.base.python="3.12" \
      workbook.base.torch="2.6"

WORKDIR /workbook
COPY . .
# The project's own install (`make venv`: python -m venv, then pip install -e '.[dev]' and the kernel),
# into /opt/venv so that a checkout bound over /workbook does not hide it. NGC images set
# PIP_CONSTRAINT to their torch build, and --system-site-packages lets the venv see it, so pip keeps it.
RUN make venv VENV=/opt/venv VENV_FLAGS=--system-site-packages
ENV PATH=/opt/venv/bin:$PATH

# -o: never reinstall at run time (the image may be read-only, as under Apptainer).
CMD ["make", "-o", "/opt/venv/.installed", "workbook", "VENV=/opt/venv"]
