//! asya-gateway: actor pipelines as MCP tools (Streamable HTTP at `/mcp`) and REST (the
//! original gateway's paths), envelope status in PostgreSQL, fed by the sidecars' reports.

pub mod access;
pub mod app;
pub mod flows;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod send;
pub mod serve;
pub mod spans;
pub mod store;
pub mod tools;
