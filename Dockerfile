# Multi-stage build of the palisade binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && cp target/release/palisade /palisade

FROM debian:bookworm-slim
RUN useradd --system --home /var/lib/palisade palisade && mkdir -p /var/lib/palisade && chown palisade /var/lib/palisade
COPY --from=build /palisade /usr/local/bin/palisade
COPY data /var/lib/palisade/data
USER palisade
WORKDIR /var/lib/palisade
ENV PALISADE_LISTEN=0.0.0.0:8080 PALISADE_DATA_DIR=/var/lib/palisade/data
EXPOSE 8080 8081
ENTRYPOINT ["palisade"]
CMD ["serve"]
