# bundlevisor in a container: the daemon binary, the demo bundle's server
# and a default config. Runs as a non-root user; the state dir is a volume.
# Build: docker build -t bundlevisor .  (deploy/ runs it on Kubernetes)
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
COPY bundles bundles
RUN cargo build --release --locked --bins

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/bundlevisor bundlevisor \
 && mkdir -p /var/lib/bundlevisor /run/bundlevisor /etc/bundlevisor /opt/bundlevisor/bundles \
 && chown bundlevisor:bundlevisor /var/lib/bundlevisor /run/bundlevisor
COPY --from=build /src/target/release/bundlevisor /usr/local/bin/bundlevisor
COPY --from=build /src/target/release/bundlevisor-demo /opt/bundlevisor/bundles/demo/server/bundlevisor-demo
COPY bundles/demo/manifest.json /opt/bundlevisor/bundles/demo/manifest.json
COPY deploy/bundlevisor.toml /etc/bundlevisor/bundlevisor.toml
USER 10001:10001
VOLUME /var/lib/bundlevisor
# The HTTP gateway (/mcp/WS) and the ops endpoints (/healthz, /readyz, /metrics).
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/bundlevisor"]
CMD ["daemon", "--config", "/etc/bundlevisor/bundlevisor.toml"]
