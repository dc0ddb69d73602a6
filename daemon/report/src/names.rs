//! Shorter function names for display: C++ template arguments and
//! parameter lists (and Rust generic arguments) elided, so a `from` line
//! or a flame graph frame fits on a screen:
//!
//! ```text
//! std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(
//!     __gnu_cxx::__normal_iterator<int*, std::vector<int, ...> >, int const&)
//!   -> std::vector<…>::_M_realloc_insert<…>(…)
//! <alloc::vec::Vec<T,A> as core::clone::Clone>::clone
//!   -> <alloc::vec::Vec<…> as core::clone::Clone>::clone
//! ```
//!
//! What is kept: namespaces, `(anonymous namespace)`, Rust's leading
//! `<Type as Trait>`, operator names (`operator<<`, `operator()`,
//! `operator new[]`), an empty `()`, and suffixes such as ` const` or
//! ` [clone .cold]`. Only display changes: `--full-names` keeps names as
//! the trace has them, and matching (sites, diffs) uses whichever the
//! command shows.

/// The shortened form of `name` (see the module docs).
pub fn shorten(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if starts_with_at(&chars, i, "operator") && !ident_char(prev(&chars, i)) {
            i = copy_operator(&chars, i, &mut out);
            continue;
        }
        match c {
            '<' if opens_arguments(&chars, i) => {
                let end = matching(&chars, i, '<', '>');
                out.push_str("<…>");
                i = end + 1;
            }
            '(' if opens_parameters(&chars, i) => {
                let end = matching(&chars, i, '(', ')');
                out.push_str(if end == i + 1 { "()" } else { "(…)" });
                i = end + 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn prev(chars: &[char], i: usize) -> char {
    if i == 0 { ' ' } else { chars[i - 1] }
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

fn starts_with_at(chars: &[char], i: usize, word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    chars.len() >= i + w.len() && chars[i..i + w.len()] == w[..]
}

/// A `<` that opens template (generic) arguments: right after a name, not
/// Rust's leading `<Type as Trait>` (at the start, or after `::` or `<`).
fn opens_arguments(chars: &[char], i: usize) -> bool {
    let p = prev(chars, i);
    ident_char(p) || p == '>' || p == ']'
}

/// A `(` that opens a parameter list: right after a name or template
/// arguments, not `(anonymous namespace)` or `{lambda(int)#1}`'s.
fn opens_parameters(chars: &[char], i: usize) -> bool {
    let p = prev(chars, i);
    (ident_char(p) || p == '>' || p == ']') && !starts_with_at(chars, i, "(anonymous")
}

/// Index of the bracket closing the one at `open` (or the last index).
fn matching(chars: &[char], open: usize, o: char, c: char) -> usize {
    let mut depth = 0usize;
    for (j, &x) in chars.iter().enumerate().skip(open) {
        if x == o {
            depth += 1;
        } else if x == c {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    chars.len() - 1
}

/// Copies `operator` and the operator's own symbols (`<<`, `()`, `new[]`,
/// `->*`...) and elides the parameter list right after; returns where the
/// rest starts.
fn copy_operator(chars: &[char], i: usize, out: &mut String) -> usize {
    out.push_str("operator");
    let mut j = operator_name_end(chars, i + "operator".len());
    out.extend(&chars[i + "operator".len()..j]);
    if chars.get(j) == Some(&'(') {
        let end = matching(chars, j, '(', ')');
        out.push_str(if end == j + 1 { "()" } else { "(…)" });
        j = end + 1;
    }
    j
}

/// End of the operator's own name, from just after `operator`.
fn operator_name_end(chars: &[char], start: usize) -> usize {
    let mut j = start;
    if chars.get(j) == Some(&' ') {
        // `operator new`, `operator delete[]`, a conversion `operator int`.
        j += 1;
        while j < chars.len() && (ident_char(chars[j]) || chars[j] == '[' || chars[j] == ']') {
            j += 1;
        }
        return j;
    }
    // `()` and `[]` are names; then symbol characters, at most three
    // (`<<=`, `->*`), so `operator< <int>` keeps its template.
    for pair in ["()", "[]"] {
        if starts_with_at(chars, j, pair) {
            return j + 2;
        }
    }
    while j < chars.len() && j - start < 3 && "<>=!+-*/%^&|~,".contains(chars[j]) {
        j += 1;
    }
    j
}

#[cfg(test)]
mod tests {
    use super::shorten;

    #[test]
    fn templates_and_parameters_are_elided() {
        assert_eq!(
            shorten(
                "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>\
                 (__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, \
                 int const&)"
            ),
            "std::vector<…>::_M_realloc_insert<…>(…)"
        );
        assert_eq!(shorten("main"), "main");
        assert_eq!(shorten("leak(int)"), "leak(…)");
        assert_eq!(shorten("f()"), "f()");
        assert_eq!(shorten("Foo::bar(int) const"), "Foo::bar(…) const");
        assert_eq!(shorten("f(int) [clone .cold]"), "f(…) [clone .cold]");
    }

    #[test]
    fn operators_namespaces_and_rust_paths_are_kept() {
        assert_eq!(shorten("operator new(unsigned long)"), "operator new(…)");
        assert_eq!(
            shorten("operator new[](unsigned long)"),
            "operator new[](…)"
        );
        assert_eq!(
            shorten("std::ostream::operator<<(int)"),
            "std::ostream::operator<<(…)"
        );
        assert_eq!(shorten("Cmp::operator()(int, int)"), "Cmp::operator()(…)");
        assert_eq!(
            shorten("(anonymous namespace)::pool::pool()"),
            "(anonymous namespace)::pool::pool()"
        );
        assert_eq!(
            shorten("<alloc::vec::Vec<T,A> as core::clone::Clone>::clone"),
            "<alloc::vec::Vec<…> as core::clone::Clone>::clone"
        );
        assert_eq!(
            shorten("alloc::raw_vec::RawVec<T,A>::grow_one"),
            "alloc::raw_vec::RawVec<…>::grow_one"
        );
        assert_eq!(shorten("unbalanced<(("), "unbalanced<…>");
    }
}
