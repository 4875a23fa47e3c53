# A thin wrapper: scripts/setup.sh is the one source of truth for installation.
FROM python:3.11-bookworm
WORKDIR /opt/tfsift
COPY . .
RUN TFSIFT_PYTHON=python3.11 bash scripts/setup.sh
ENV PATH=/opt/tfsift/.venv/bin:$PATH TF_CPP_MIN_LOG_LEVEL=3
CMD ["bash", "scripts/example.sh"]
