//! The boringtun tunnel (to be written).
