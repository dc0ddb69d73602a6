//! What symbolization says of one address: a function, its file and line.

/// One (possibly inlined) function at an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymbolFrame {
    /// Demangled function name.
    pub function: Option<String>,
    /// Source file (as recorded in DWARF, directory joined).
    pub file: Option<String>,
    /// Source line.
    pub line: Option<u32>,
}
