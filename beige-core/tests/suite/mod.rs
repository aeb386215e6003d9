mod agent;
mod core_tools;
mod hooks;
mod http_api;
mod sandbox_docker;
mod support;
mod telegram;
mod tools_socket;
