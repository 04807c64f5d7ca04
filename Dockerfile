# gpuaas: one image for every process; the Deployment chooses the command (deploy/*.yaml):
#   web        gunicorn gpuaas.wsgi:application (the default CMD)
#   workers    celery -A gpuaas worker -Q default|discovery|metrics|billing
#   beat       celery -A gpuaas beat --scheduler redbeat.RedBeatScheduler (an active one and a standby)
#   agent      celery -A gpuaas worker -Q node.<cluster>.<node> with GPUAAS_ROLE=node-agent
#   migrate    python manage.py migrate --noinput (the Job run before each upgrade)
# No secret is baked in: settings come from the environment at run time (docs/deploying.md).
# Pin the base by digest in your registry mirror: FROM python:3.11.14-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /build
COPY requirements.txt .
# Only the runtime pins (the file's first section); test and lint tools stay out of the image.
RUN sed '/^# Tests and lint/,$d' requirements.txt > runtime-requirements.txt \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --requirement runtime-requirements.txt
COPY . /app
WORKDIR /app
# Static files are collected at build time into the read-only image (WhiteNoise serves them).
# DEBUG=1 only for this one command: collectstatic reads no secret and the image keeps none.
RUN DEBUG=1 GPUAAS_VAR_DIR=/app/var /opt/venv/bin/python manage.py collectstatic --noinput --verbosity 0 \
    && rm -f /app/var/*.sqlite3*

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=gpuaas.settings \
    GPUAAS_VAR_DIR=/app/var
RUN groupadd --system --gid 10001 gpuaas \
    && useradd --system --uid 10001 --gid gpuaas --home-dir /app --no-create-home --shell /usr/sbin/nologin gpuaas
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder --chown=root:root /app /app
WORKDIR /app
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8000
CMD ["gunicorn", "gpuaas.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--worker-tmp-dir", "/dev/shm", "--access-logfile", "-"]
