//! The neutral message model: roles and blocks of text, tool calls and tool
//! results. The JSON adapters and the gRPC API convert to and from it.

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// System prompt.
    System,
    /// The user (and, in Anthropic's format, tool results).
    User,
    /// The model.
    Assistant,
    /// A tool result message (OpenAI's `role: tool`).
    Tool,
}

/// A tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolUse {
    /// Call ID.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as JSON text.
    pub input_json: String,
}

/// A tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The call it answers.
    pub tool_use_id: String,
    /// Its text.
    pub content: String,
    /// Whether it reports an error.
    pub is_error: bool,
    /// Machine-readable error code, e.g. `missing_result`.
    pub error_code: String,
    /// The tool's name, when known.
    pub tool_name: String,
}

/// A piece of a provider-format history kept verbatim and not interpreted:
/// an image, a document, a thinking block, a Responses reasoning item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its JSON text, as it came (see the context room's adapters for what
    /// one part is in each format).
    pub json: String,
    /// It belongs to the content of the tool result just before it in the
    /// same message (an image a tool returned).
    pub of_result: bool,
}

/// One block of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// Text.
    Text(String),
    /// A tool call.
    ToolUse(ToolUse),
    /// A tool result.
    ToolResult(ToolResult),
    /// A provider piece kept verbatim.
    Part(Part),
}

/// A message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Role.
    pub role: Role,
    /// Blocks in order.
    pub blocks: Vec<Block>,
}

impl Message {
    /// The tool calls of the message, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = &ToolUse> {
        self.blocks.iter().filter_map(|b| match b {
            Block::ToolUse(u) => Some(u),
            _ => None,
        })
    }

    /// The tool results of the message, in order.
    pub fn tool_results(&self) -> impl Iterator<Item = &ToolResult> {
        self.blocks.iter().filter_map(|b| match b {
            Block::ToolResult(r) => Some(r),
            _ => None,
        })
    }

    /// Whether the message carries at least one tool result.
    pub fn has_results(&self) -> bool {
        self.blocks
            .iter()
            .any(|b| matches!(b, Block::ToolResult(_)))
    }

    /// An assistant message with at least one tool call.
    pub fn has_calls(&self) -> bool {
        self.role == Role::Assistant && self.blocks.iter().any(|b| matches!(b, Block::ToolUse(_)))
    }
}
