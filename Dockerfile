# The stack's images. This file's last stage, horovod-stack:latest: Open MPI, sshd, Python 3.11 with torch 2.14.1 /
# torchvision 0.29.1 and their CUDA, cuDNN and NCCL libraries (NVIDIA's wheels), and Horovod built with NCCL, MPI and
# Gloo ops; the trainer and the entrypoint roles (worker: sshd; launcher: mpirun). The same image serves GPU hosts
# (through the NVIDIA Container Toolkit) and CPU hosts (Gloo and MPI ops). The `tensorflow` target beside it is the
# same stack on TensorFlow 2.21 (horovod-stack:tensorflow; its stages below say more).
#
# Online (the defaults), on any Docker host with BuildKit (Docker >= 23) that reaches Docker Hub and PyPI:
#   docker build -t horovod-stack:latest .
# (behind a TLS-intercepting proxy, add its CA for pip: --secret id=ca,src=CA_BUNDLE; mounted for pip's steps
# only, never stored in a layer). Offline, where no registry answers (as on this project's CI machines): a local
# Debian 12 base image and a wheel folder, which scripts/build-images.sh makes and passes by itself:
#   docker buildx build --build-arg BASE_IMAGE=horovod-stack-base:bookworm --build-arg PIP_OFFLINE=1 \
#     --build-context wheels=DIR --secret id=ca,src=CA_BUNDLE -t horovod-stack:latest .
# BASE_IMAGE may be any Debian 12 image (its Python 3.11 matches the wheels); an nvidia/cuda base works too
# where pip can reach its index for that Python.
ARG BASE_IMAGE=debian:bookworm-slim

# Local wheels and the Horovod sdist, for builds without an index: --build-context wheels=DIR.
# Left empty (the default), pip uses its index (give the proxy's CA, if any, as the build secret "ca").
FROM scratch AS wheels

# What both images share: Open MPI, sshd and an empty Python environment.
FROM ${BASE_IMAGE} AS system
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# openssh-server's package makes host keys: they are deleted, since each container makes its own at start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv openmpi-bin openssh-server \
      openssh-client ca-certificates iproute2 procps \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/ssh/ssh_host_* \
 && python3 -m venv /opt/venv

# PyTorch's environment (horovod-stack:latest).
FROM system AS runtime
# PIP_OFFLINE=1: install from the wheels context alone, never the index (scripts/build-images.sh sets it).
ARG PIP_OFFLINE=0
# The CA is mounted for this step only (never a layer) and only used by pip when given.
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=docker/requirements-runtime.txt,target=/tmp/requirements.txt \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    if [ "$PIP_OFFLINE" = 1 ]; then export PIP_NO_INDEX=1; fi; \
    pip install -r /tmp/requirements.txt

# --- horovod-stack:tensorflow: the same stack on TensorFlow 2.21 (Keras 3 by default; Keras 2 through tf_keras and
# TF_USE_LEGACY_KERAS=1) with its CUDA 12 wheels, beside PyTorch's image, since the two CUDA stacks (and their NCCLs)
# cannot share one Python environment:
#   docker build --target tensorflow -t horovod-stack:tensorflow .      (scripts/build-images.sh tensorflow)
# Horovod is built with NCCL, MPI and Gloo ops against TensorFlow 2.21 (docker/patch-horovod-tensorflow.sh: TensorFlow
# 2.21 and Keras 3), linked to the cudart and NCCL of TensorFlow's own wheels; its CUDA kernels are compiled by a CUDA
# 12.4 nvcc from Debian's archive that never leaves the build stage (docker/cuda-toolkit-12.sh).
FROM system AS tensorflow-runtime
ARG PIP_OFFLINE=0
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=docker/requirements-tensorflow.txt,target=/tmp/requirements.txt \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    if [ "$PIP_OFFLINE" = 1 ]; then export PIP_NO_INDEX=1; fi; \
    pip install -r /tmp/requirements.txt

FROM tensorflow-runtime AS horovod-build-tensorflow
ARG PIP_OFFLINE=0
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ make libopenmpi-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
# The CUDA 12 compiler folder (docker/cuda-toolkit-12.sh) is made and removed inside this stage: only the wheel leaves.
COPY docker/install-horovod.sh docker/patch-horovod-source.sh docker/patch-horovod-tensorflow.sh \
     docker/cuda-toolkit-12.sh docker/requirements-cuda12-toolkit.txt docker/requirements-build.txt /build/
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=cache,target=/var/cache/horovod-stack/wheels \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    if [ "$PIP_OFFLINE" = 1 ]; then export PIP_NO_INDEX=1; fi; \
    pip install -r /build/requirements-build.txt \
 && PYTHON=/opt/venv/bin/python HOROVOD_WHEEL_EXPORT=/dist /build/install-horovod.sh gpu

FROM tensorflow-runtime AS tensorflow
ARG PIP_OFFLINE=0
# Horovod (runner patched), py-spy, the image's user and folders: docker/finish-image.sh, as for the PyTorch image.
RUN --mount=type=bind,from=horovod-build-tensorflow,source=/dist,target=/dist \
    --mount=type=bind,source=docker/horovod-runner,target=/tmp/horovod-runner \
    --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=docker/requirements-tools.txt,target=/tmp/requirements-tools.txt \
    --mount=type=bind,source=docker/finish-image.sh,target=/tmp/finish-image.sh \
    /tmp/finish-image.sh
# Which framework the image holds, for the launcher's GPU check (app/gpu.py's FRAMEWORK_LABEL); images built FROM
# this one inherit it.
LABEL horovod-stack.framework=TensorFlow
COPY app /opt/horovod-stack/app
COPY launcher /opt/horovod-stack/launcher
COPY docker/entrypoint.sh docker/discover-hosts.sh docker/sshd_config /opt/horovod-stack/docker/
# A script of the other framework's ends in one line naming its image (app/frameworks.py, run at every start).
COPY app/frameworks.py /opt/venv/lib/python3.11/site-packages/horovod_stack_hint.py
# A rank that dies of an uncaught exception writes its record (app/rank_error.py), read by the job agent.
COPY app/rank_error.py /opt/venv/lib/python3.11/site-packages/horovod_stack_rank_error.py
COPY docker/horovod_stack_hint.pth /opt/venv/lib/python3.11/site-packages/
# TensorFlow 2.21's wheel is a CUDA 12.5.1 build (tensorflow[and-cuda]), which TensorFlow supports on drivers from
# 525.60.13 on (CUDA 12's minor-version compatibility): the toolkit is asked for CUDA 12.0, not 12.5 (a driver of 555
# or newer), and the launcher's GPU check holds a node to app/gpu.py's TENSORFLOW_BUILD. TF_CPP_MIN_LOG_LEVEL=1 keeps TensorFlow's
# informational lines out of processes started here, its warnings and errors in. Ranks on other nodes start through
# ssh without it, and the oneDNN notice printed before absl starts shows whatever it is set to.
ENV PYTHONPATH=/opt/horovod-stack NVIDIA_VISIBLE_DEVICES=void NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=12.0" PIP_FIND_LINKS= TF_CPP_MIN_LOG_LEVEL=1
USER mpiuser
RUN python -c "import matplotlib.font_manager"
WORKDIR /home/mpiuser
USER 0:1000
ENTRYPOINT ["/opt/horovod-stack/docker/entrypoint.sh"]
CMD ["worker"]

# --- horovod-stack:latest (PyTorch), the Dockerfile's last stage: what `docker build .` builds.
FROM runtime AS horovod-build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ make libopenmpi-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
COPY docker/install-horovod.sh docker/patch-horovod-source.sh docker/requirements-build.txt \
     docker/requirements-cuda-toolkit.txt /build/
# The wheel cache survives across builds on this machine, so changing anything else never rebuilds Horovod.
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=cache,target=/var/cache/horovod-stack/wheels \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    if [ "$PIP_OFFLINE" = 1 ]; then export PIP_NO_INDEX=1; fi; \
    pip install -r /build/requirements-build.txt \
 && PYTHON=/opt/venv/bin/python HOROVOD_WHEEL_EXPORT=/dist /build/install-horovod.sh gpu

FROM runtime AS image
ARG PIP_OFFLINE=0
# Horovod with its runner patched (the wheel stays cached), py-spy, the image's user and folders:
# docker/finish-image.sh, shared with the TensorFlow image.
RUN --mount=type=bind,from=horovod-build,source=/dist,target=/dist \
    --mount=type=bind,source=docker/horovod-runner,target=/tmp/horovod-runner \
    --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca,target=/run/secrets/ca \
    --mount=type=bind,source=docker/requirements-tools.txt,target=/tmp/requirements-tools.txt \
    --mount=type=bind,source=docker/finish-image.sh,target=/tmp/finish-image.sh \
    /tmp/finish-image.sh
LABEL horovod-stack.framework=PyTorch
COPY app /opt/horovod-stack/app
# The job agent (launcher/agent/) runs every job from the rank-0 container, whichever launch method started it.
COPY launcher /opt/horovod-stack/launcher
COPY docker/entrypoint.sh docker/discover-hosts.sh docker/sshd_config /opt/horovod-stack/docker/
# A script of the other framework's ends in one line naming its image (app/frameworks.py, run at every start).
COPY app/frameworks.py /opt/venv/lib/python3.11/site-packages/horovod_stack_hint.py
# A rank that dies of an uncaught exception writes its record (app/rank_error.py), read by the job agent.
COPY app/rank_error.py /opt/venv/lib/python3.11/site-packages/horovod_stack_rank_error.py
COPY docker/horovod_stack_hint.pth /opt/venv/lib/python3.11/site-packages/
# GPUs only when a container asks for them: Docker's device request (--gpus, compose's devices:, the launcher's
# GPU workers) sets NVIDIA_VISIBLE_DEVICES to the GPUs asked for, over this `void`, so a CPU worker on a host whose
# default runtime is nvidia sees none. torch 2.14.1 from PyPI is a CUDA 13.0 build: the NVIDIA Container Toolkit
# refuses a driver too old for it (< 580) with its own message, instead of a job that quietly trains on the CPU.
ENV PYTHONPATH=/opt/horovod-stack NVIDIA_VISIBLE_DEVICES=void NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0" PIP_FIND_LINKS=
USER mpiuser
# matplotlib's font cache, made once here rather than by every job's rank 0 (curves.png) in a fresh container.
RUN python -c "import matplotlib.font_manager"
WORKDIR /home/mpiuser
# Containers start as root in mpiuser's group, which the entrypoint reads as "no user given": every role but `smoke`
# becomes mpiuser at once (setpriv), as before; `smoke` becomes the owner of the mounted checkout, whoever that is,
# so `docker run -v "$PWD:/workdir" -w /workdir IMAGE smoke ...` works on any CI runner's checkout and leaves files
# its owner can delete. A user given (--user, compose's and the launcher's workers, an MPIJob's runAsUser) is kept.
USER 0:1000
ENTRYPOINT ["/opt/horovod-stack/docker/entrypoint.sh"]
CMD ["worker"]
