//! The rsocket error: an errno (sockets have more of them than verbs) and a message that
//! names the socket and the cause.

/// A failed rsocket call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct RsError {
    /// The errno the C call reports.
    pub errno: i32,
    /// What happened, naming the socket.
    pub msg: String,
}

/// Result of rsocket calls.
pub type Result<T> = std::result::Result<T, RsError>;

impl RsError {
    /// An error with this errno and message.
    pub fn new(errno: i32, msg: impl Into<String>) -> RsError {
        RsError { errno, msg: msg.into() }
    }

    /// EAGAIN: a non-blocking call found nothing to do.
    pub fn again(what: &str) -> RsError {
        RsError::new(libc::EAGAIN, format!("{what}: would block"))
    }

    /// True for EAGAIN / EWOULDBLOCK.
    pub fn would_block(&self) -> bool {
        self.errno == libc::EAGAIN
    }
}

impl From<softrdma_verbs::Error> for RsError {
    fn from(e: softrdma_verbs::Error) -> RsError {
        RsError {
            errno: e.errno.raw(),
            msg: e.msg,
        }
    }
}
