//! soft-iWARP.
