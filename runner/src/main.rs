//! `mlxkit`: a local model server speaking Ollama's and OpenAI's APIs, and its CLI.

fn main() -> std::process::ExitCode {
    runner::cli::main()
}
