# softrdma in a container: Debian 12's unmodified rdma-core tools over softrdma, run as an
# unprivileged user (no RDMA NIC, no kernel module, no --privileged, no extra capabilities).
#
#   docker build -t softrdma .
#   docker run --rm softrdma                      # softrdma run -- ibv_devinfo
#   docker run --rm softrdma softrdma run -- sh -c 'rping -s -a 127.0.0.1 -C 10 & s=$!; sleep 1; rping -c -a 127.0.0.1 -C 10 -V && wait $s'
#
# Stage 1 builds the CLI and the drop-in library with `cargo xtask install`; stage 2 is Debian
# with the rdma-core tools and what stage 1 installed under /usr/local.

FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/opt/rustup CARGO_HOME=/opt/cargo PATH=/opt/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain stable
COPY . /src
WORKDIR /src
RUN cargo xtask install --prefix /usr/local

FROM debian:bookworm
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ibverbs-utils rdmacm-utils perftest iproute2 \
 && rm -rf /var/lib/apt/lists/*
# /usr/local/bin/softrdma and /usr/local/lib/softrdma/ (libsoftrdma.so and the libibverbs.so.1,
# librdmacm.so.1, libmlx5.so.1 and libefa.so.1 links to it; the system's libibverbs stays)
COPY --from=build /usr/local/ /usr/local/
# Not `rdma`: libibverbs1's postinst creates a system group of that name, so `useradd rdma`
# would fail ("group rdma exists"; found by scripts/dockerfile-chroot.sh).
RUN useradd --create-home --shell /bin/bash app
USER app
WORKDIR /home/app
CMD ["softrdma", "run", "--", "ibv_devinfo"]
