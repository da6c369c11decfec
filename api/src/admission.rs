//! What both halves of admission share: the operation of the request. Defaulting
//! ([`crate::defaulting`]) and validation ([`crate::validate`]) each read it; neither depends on
//! the other for it.

/// The admission operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// CREATE.
    Create,
    /// UPDATE.
    Update,
    /// DELETE (never routed to the webhook, but handled).
    Delete,
    /// CONNECT.
    Connect,
}

impl Operation {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}
