ARG BASE=debian:bookworm-slim
FROM ${BASE}
