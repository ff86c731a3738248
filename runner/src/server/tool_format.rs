//! Which tool format a model uses, as `/api/show` reports it (`tool_format`): `template`
//! when its chat template shows tools, `hermes` or `generic` when tools are written into the
//! system turn (see [`tokenizer::ToolFormat`]).

use crate::engine::ModelInfo;

/// The format of a model, probed at load when it is `loaded`. A model that is not loaded is
/// known to use `template` when the `capabilities` recorded from its template at import list
/// `tools`; otherwise which of the others it uses depends on its vocabulary's family, known
/// once it loads, and this is `None`.
pub fn for_show(loaded: Option<&ModelInfo>, capabilities: &[String]) -> Option<&'static str> {
    match loaded {
        Some(info) => Some(info.tool_format.name()),
        None if capabilities.iter().any(|c| c == "tools") => {
            Some(tokenizer::ToolFormat::Template.name())
        }
        None => None,
    }
}
