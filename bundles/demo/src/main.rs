//! The demo bundle: a small MCP server over stdio, shipped as an example
//! and used as the fixture of the integration tests.
//!
//! Tools: `echo`, `add`, `sleep`, `fail` (a tool error), `crash` (the
//! process exits), `env` (reads an environment variable).

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;

#[derive(Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: f64,
    b: f64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct SleepArgs {
    /// Milliseconds to wait before answering.
    ms: u64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct FailArgs {
    /// Error message of the tool result.
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct CrashArgs {
    /// Exit code of the process.
    #[serde(default)]
    code: Option<i32>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct EnvArgs {
    /// Name of the environment variable.
    name: String,
}

#[derive(Clone)]
struct Demo {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Demo {
    fn new() -> Self {
        Demo {
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Echo the text back (after DEMO_GREETING, when set)")]
    async fn echo(
        &self,
        Parameters(args): Parameters<EchoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let greeting = std::env::var("DEMO_GREETING").unwrap_or_default();
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "{greeting}{}",
            args.text
        ))]))
    }

    #[tool(description = "Add two numbers")]
    async fn add(
        &self,
        Parameters(args): Parameters<AddArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text(
            (args.a + args.b).to_string(),
        )]))
    }

    #[tool(description = "Wait for the given number of milliseconds, then answer")]
    async fn sleep(
        &self,
        Parameters(args): Parameters<SleepArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "slept {} ms",
            args.ms
        ))]))
    }

    #[tool(description = "Return a tool error")]
    async fn fail(
        &self,
        Parameters(args): Parameters<FailArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let message = args.message.unwrap_or_else(|| "demo failure".into());
        Ok(CallToolResult::error(vec![ContentBlock::text(message)]))
    }

    #[tool(description = "Exit the bundle process with the given code (default 3)")]
    async fn crash(
        &self,
        Parameters(args): Parameters<CrashArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let code = args.code.unwrap_or(3);
        eprintln!("demo: crashing on request with exit code {code}");
        std::process::exit(code);
    }

    #[tool(description = "Read an environment variable of the bundle process")]
    async fn env(
        &self,
        Parameters(args): Parameters<EnvArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let value = std::env::var(&args.name).unwrap_or_else(|_| "(unset)".into());
        Ok(CallToolResult::success(vec![ContentBlock::text(value)]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Demo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("demo: starting (pid {})", std::process::id());
    let service = Demo::new().serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    eprintln!("demo: stdin closed, exiting");
    Ok(())
}
