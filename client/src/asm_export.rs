//! `export!`: the directives that export an assembly hook under its
//! symbol name (`.globl`, `.type @function`, the label), for the naked
//! hooks of `cxxhooks.rs` and `exechooks.rs`. The unit-test build exports
//! nothing: its own binary must not be interposed by its hooks.

/// The exported name of an assembly hook.
#[cfg(all(any(target_arch = "x86_64", target_arch = "aarch64"), not(test)))]
macro_rules! export {
    ($sym:literal) => {
        concat!(
            ".globl ",
            $sym,
            "\n.type ",
            $sym,
            ", %function\n",
            $sym,
            ":"
        )
    };
}

/// Nothing in the unit-test build.
#[cfg(all(any(target_arch = "x86_64", target_arch = "aarch64"), test))]
macro_rules! export {
    ($sym:literal) => {
        ""
    };
}
