//! sans-I/O wire codecs.
