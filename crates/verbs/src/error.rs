//! The one error type of the verbs core. Every error carries an errno (the C ABI maps it 1:1)
//! and a message that names the object and the cause.

use std::fmt;

/// errno values the verbs and CM layers report. The C boundary maps these to `errno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Errno {
    /// EINVAL: bad argument or wrong object state.
    Inval,
    /// ENOMEM: a queue or table is full.
    NoMem,
    /// ENODEV: no such device / port.
    NoDev,
    /// EADDRNOTAVAIL: address not on this host, or no device qualifies.
    AddrNotAvail,
    /// EADDRINUSE: port already taken.
    AddrInUse,
    /// EACCES: privileged port, or access rights.
    Acces,
    /// ECONNREFUSED: the peer rejected or nothing listens.
    ConnRefused,
    /// ECONNRESET: the peer reset the connection.
    ConnReset,
    /// ETIMEDOUT: a bounded wait expired.
    TimedOut,
    /// EAGAIN: nothing ready on a non-blocking object.
    Again,
    /// EBUSY: the object still has dependents.
    Busy,
    /// ENOTCONN: the QP or id is not connected.
    NotConn,
    /// EISCONN: already connected.
    IsConn,
    /// EOPNOTSUPP: the operation is not supported by this device.
    OpNotSupp,
    /// EPROTO: the peer broke the protocol.
    Proto,
    /// EHOSTUNREACH: no route to the host.
    HostUnreach,
    /// EMFILE: the process is out of file descriptors.
    MFile,
    /// ENFILE: the system is out of file descriptors.
    NFile,
    /// EIO: an OS-level I/O failure.
    Io,
    /// EFAULT: a memory range is not mapped with the protections the access needs.
    Fault,
}

impl Errno {
    /// The Linux errno number.
    pub fn raw(self) -> i32 {
        match self {
            Errno::Inval => libc::EINVAL,
            Errno::NoMem => libc::ENOMEM,
            Errno::NoDev => libc::ENODEV,
            Errno::AddrNotAvail => libc::EADDRNOTAVAIL,
            Errno::AddrInUse => libc::EADDRINUSE,
            Errno::Acces => libc::EACCES,
            Errno::ConnRefused => libc::ECONNREFUSED,
            Errno::ConnReset => libc::ECONNRESET,
            Errno::TimedOut => libc::ETIMEDOUT,
            Errno::Again => libc::EAGAIN,
            Errno::Busy => libc::EBUSY,
            Errno::NotConn => libc::ENOTCONN,
            Errno::IsConn => libc::EISCONN,
            Errno::OpNotSupp => libc::EOPNOTSUPP,
            Errno::Proto => libc::EPROTO,
            Errno::HostUnreach => libc::EHOSTUNREACH,
            Errno::MFile => libc::EMFILE,
            Errno::NFile => libc::ENFILE,
            Errno::Io => libc::EIO,
            Errno::Fault => libc::EFAULT,
        }
    }

    /// Maps an OS errno back to the closest variant (unknown values become `Io`).
    pub fn from_raw(raw: i32) -> Errno {
        match raw {
            libc::EINVAL => Errno::Inval,
            libc::EFAULT => Errno::Fault,
            libc::ENOMEM | libc::ENOBUFS => Errno::NoMem,
            libc::ENODEV => Errno::NoDev,
            libc::EADDRNOTAVAIL => Errno::AddrNotAvail,
            libc::EADDRINUSE => Errno::AddrInUse,
            libc::EACCES | libc::EPERM => Errno::Acces,
            libc::ECONNREFUSED => Errno::ConnRefused,
            libc::ECONNRESET | libc::EPIPE => Errno::ConnReset,
            libc::ETIMEDOUT => Errno::TimedOut,
            libc::EAGAIN => Errno::Again,
            libc::EBUSY => Errno::Busy,
            libc::ENOTCONN => Errno::NotConn,
            libc::EISCONN => Errno::IsConn,
            libc::EOPNOTSUPP => Errno::OpNotSupp,
            libc::EPROTO => Errno::Proto,
            libc::EHOSTUNREACH | libc::ENETUNREACH => Errno::HostUnreach,
            libc::EMFILE => Errno::MFile,
            libc::ENFILE => Errno::NFile,
            _ => Errno::Io,
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Errno::Inval => "EINVAL",
            Errno::NoMem => "ENOMEM",
            Errno::NoDev => "ENODEV",
            Errno::AddrNotAvail => "EADDRNOTAVAIL",
            Errno::AddrInUse => "EADDRINUSE",
            Errno::Acces => "EACCES",
            Errno::ConnRefused => "ECONNREFUSED",
            Errno::ConnReset => "ECONNRESET",
            Errno::TimedOut => "ETIMEDOUT",
            Errno::Again => "EAGAIN",
            Errno::Busy => "EBUSY",
            Errno::NotConn => "ENOTCONN",
            Errno::IsConn => "EISCONN",
            Errno::OpNotSupp => "EOPNOTSUPP",
            Errno::Proto => "EPROTO",
            Errno::HostUnreach => "EHOSTUNREACH",
            Errno::MFile => "EMFILE",
            Errno::NFile => "ENFILE",
            Errno::Io => "EIO",
            Errno::Fault => "EFAULT",
        };
        f.write_str(s)
    }
}

/// A verbs-layer error: an errno plus a message naming the object and the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg} ({errno})")]
pub struct Error {
    /// The errno the C ABI reports.
    pub errno: Errno,
    /// Human-readable cause, naming the object.
    pub msg: String,
}

impl Error {
    /// Builds an error from an errno and a message.
    pub fn new(errno: Errno, msg: impl Into<String>) -> Error {
        Error { errno, msg: msg.into() }
    }

    /// EINVAL with a message.
    pub fn inval(msg: impl Into<String>) -> Error {
        Error::new(Errno::Inval, msg)
    }

    /// Wraps an OS error with context.
    pub fn os(context: impl fmt::Display, err: &std::io::Error) -> Error {
        let errno = err.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::Io);
        Error::new(errno, format!("{context}: {err}"))
    }
}

/// Result alias for the verbs core.
pub type Result<T> = std::result::Result<T, Error>;

/// Returns early with an `Error` of the given errno and formatted message.
#[macro_export]
macro_rules! bail {
    ($errno:ident, $($arg:tt)*) => {
        return Err($crate::Error::new($crate::Errno::$errno, format!($($arg)*)))
    };
}
