mod core_tools;
mod sandbox_docker;
mod support;
