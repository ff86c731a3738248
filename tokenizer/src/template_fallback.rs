//! Chat templates for checkpoints that ship none (Gemma 3's GGUF, for one), per [`Family`].
//!
//! Written for this crate after each family's documented prompt format; they render the same
//! turns as the official templates for plain conversations, and tools where the format has them.

use crate::family::Family;

const CHATML: &str = r##"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" + (tool | tojson) }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"##;

const LLAMA3: &str = r##"{{- bos_token }}
{%- if tools %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content | trim + '\n\n' }}{%- endif %}
{{- 'You have access to the following functions. To call a function, respond with JSON of the form {"name": function name, "parameters": dictionary of argument name and its value}.\n\n' }}
{%- for tool in tools %}{{- tool | tojson(indent=4) }}{{- '\n\n' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if tools and message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim }}
{%- for call in message.tool_calls or [] %}
{{- '{"name": "' + call.function.name + '", "parameters": ' + (call.function.arguments | tojson) + '}' }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"##;

const GEMMA: &str = r##"{{- bos_token }}
{%- set ns = namespace(prefix='') %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- set ns.prefix = ns.prefix + message.content | trim + '\n\n' %}
{%- else %}
{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else 'user') + '\n' + ns.prefix + message.content | trim + '<end_of_turn>\n' }}
{%- set ns.prefix = '' %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}"##;

const MISTRAL: &str = r##"{{- bos_token }}
{%- set ns = namespace(system='') %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- set ns.system = ns.system + message.content + '\n\n' %}
{%- elif message.role == 'user' %}
{{- '[INST] ' + ns.system + message.content + '[/INST]' }}
{%- set ns.system = '' %}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS] {"content": ' + (message.content | tojson) + '}[/TOOL_RESULTS]' }}
{%- else %}
{{- message.content }}
{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}{%- for call in message.tool_calls %}{{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}' + (', ' if not loop.last else '') }}{%- endfor %}{{- ']' }}{%- endif %}
{{- eos_token }}
{%- endif %}
{%- endfor %}"##;

impl Family {
    /// The template used when a checkpoint of this family ships none.
    pub fn fallback_template(self) -> &'static str {
        match self {
            Family::ChatMl | Family::Qwen3 => CHATML,
            Family::Llama3 => LLAMA3,
            Family::Gemma => GEMMA,
            Family::Mistral => MISTRAL,
        }
    }
}
