# bundlevisor in a container: the daemon binary, the demo bundle's server
# and a default config. The daemon runs as root inside the container, with
# a reduced capability set (deploy/base), so that every bundle runs under a
# uid of its own ([sandbox] uid_range): the kernel keeps bundles off the
# control socket and out of each other's files, /proc entries and signals
# (docs/scaling.md, "Why the pod runs as root"). The state dir is a volume.
# Build: docker build -t bundlevisor .  (deploy/ runs it on Kubernetes;
# `make container-check` builds the runtime stage below from `make`'s
# release binaries and attacks it from a bundle, tests/container/check).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
COPY bundles bundles
RUN cargo build --release --locked --bins

# --- runtime ---
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -m 0700 /var/lib/bundlevisor \
 && install -d -m 0755 /etc/bundlevisor /opt/bundlevisor/bundles/demo/server
COPY --from=build /src/target/release/bundlevisor /usr/local/bin/bundlevisor
COPY --from=build /src/target/release/bundlevisor-demo /opt/bundlevisor/bundles/demo/server/bundlevisor-demo
COPY bundles/demo/manifest.json /opt/bundlevisor/bundles/demo/manifest.json
COPY deploy/bundlevisor.toml /etc/bundlevisor/bundlevisor.toml
VOLUME /var/lib/bundlevisor
# The daemon creates the socket's folder 0700; `kubectl exec … bundlevisor
# status` finds the socket through this.
ENV BUNDLEVISOR_SOCKET=/run/bundlevisor/bundlevisor.sock
# The HTTP gateway (/mcp/WS) and the ops endpoints (/healthz, /readyz, /metrics).
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/bundlevisor"]
CMD ["daemon", "--config", "/etc/bundlevisor/bundlevisor.toml"]
