# Multi-stage build: static binaries on a distroless base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/...
# The volumes' mount points, owned by the runtime user (distroless
# nonroot, 65532): a named volume starts as a copy of them, so the
# binaries can write their data and the controller its key.
RUN mkdir -p /volumes/data /volumes/controller

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY --from=build --chown=65532:65532 /volumes/data /data
COPY --from=build --chown=65532:65532 /volumes/controller /controller
USER nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/api"]
