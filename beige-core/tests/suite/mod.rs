mod agent;
mod core_tools;
mod hooks;
mod sandbox_docker;
mod support;
mod tools_socket;
