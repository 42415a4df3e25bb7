# Multi-stage build of the palisade binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && cp target/release/palisade /palisade

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home /var/lib/palisade palisade && mkdir -p /var/lib/palisade && chown palisade /var/lib/palisade
COPY --from=build /palisade /usr/local/bin/palisade
COPY data /var/lib/palisade/data
USER palisade
WORKDIR /var/lib/palisade
# HTTP and Envoy's gRPC on every interface of the container (the host decides what is
# published); the SQLite default lives in the data volume.
ENV PALISADE_LISTEN=0.0.0.0:8080 PALISADE_GRPC_LISTEN=0.0.0.0:8081 \
    PALISADE_DATA_DIR=/var/lib/palisade/data \
    PALISADE_DATABASE_URL=sqlite:///var/lib/palisade/palisade.db
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=4s --start-period=20s --retries=3 CMD ["palisade", "health"]
ENTRYPOINT ["palisade"]
CMD ["serve"]
