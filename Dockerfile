# syntax=docker/dockerfile:1

# ratelimitd's image: one static binary on distroless (no shell, no package
# manager), run as the non-root user 65532, with the example rules in
# /etc/ratelimitd.
#
#   docker build -t ratelimitd .
#   docker run --rm -p 8080:8080 -p 8081:8081 ratelimitd
#   docker run --rm -v "$PWD/rules:/etc/ratelimitd:ro" ratelimitd -config /etc/ratelimitd -backend redis -redis-url redis://redis:6379
#
# Arguments replace CMD, so give -config with any others. Rules mounted over
# /etc/ratelimitd reload when they change.

ARG GO_VERSION=1.26

# Build on the builder's own platform and cross-compile (no emulation) for
# the target one: docker buildx build --platform linux/amd64,linux/arm64 .
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS TARGETARCH
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /ratelimitd ./cmd/ratelimitd
# envoyproxy/ratelimit's entry point, /bin/ratelimit, a link to the binary:
# run under that name, ratelimitd takes the reference's environment
# (docs/migrating.md), so its Deployments switch by the image alone.
RUN mkdir -p /links/bin && ln -s /ratelimitd /links/bin/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="ratelimitd" \
      org.opencontainers.image.description="Rate-limit decision service for Envoy's RateLimitService v3" \
      org.opencontainers.image.source="https://github.com/ratelimitd/ratelimitd"
COPY --from=build /ratelimitd /ratelimitd
COPY --from=build /links/ /
COPY examples/*.yaml /etc/ratelimitd/
USER 65532:65532
# 8080: HTTP (/json, /healthcheck, /metrics, /rlconfig, /explain); 8081: gRPC.
EXPOSE 8080 8081
ENTRYPOINT ["/ratelimitd"]
CMD ["-config", "/etc/ratelimitd"]
