//! Which user contexts a profile samples in: `record --context
//! KEY=VALUE | KEY | any` (repeatable; a context passing any of them is
//! sampled, nothing outside them), turned into the client configuration's
//! context filters (shared with `record -- CMD`).

use heapprofd_proto::wire::{ClientConfig, ContextFilter, MAX_CONTEXT_FILTERS, MAX_FILTER_KEY};

/// Checks one `--context` value (clap's parser): the value itself.
pub fn parse_context_filter(s: &str) -> Result<String, String> {
    match ContextFilter::parse(s) {
        Some(_) => Ok(s.to_owned()),
        None => Err(format!(
            "expected KEY=VALUE, KEY or `any` (a key of 1 to {MAX_FILTER_KEY} bytes, a value of \
             at most 255), not `{}`",
            s.escape_debug()
        )),
    }
}

/// Writes the filters into `c`; an error names the first one that does
/// not fit.
pub fn apply_context_filters(filters: &[String], c: &mut ClientConfig) -> Result<(), String> {
    if filters.len() > MAX_CONTEXT_FILTERS {
        return Err(format!(
            "at most {MAX_CONTEXT_FILTERS} --context filters, not {}",
            filters.len()
        ));
    }
    for s in filters {
        let f = ContextFilter::parse(s).ok_or_else(|| parse_context_filter(s).unwrap_err())?;
        c.add_context_filter(f);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_into_the_config() {
        let mut c = ClientConfig::new(4096, 1 << 20);
        let fs = ["endpoint=/a".to_owned(), "any".to_owned()];
        apply_context_filters(&fs, &mut c).unwrap();
        assert_eq!(c.context_filters().len(), 2);
        assert!(parse_context_filter("=x").is_err());
        let many = vec!["k".to_owned(); MAX_CONTEXT_FILTERS + 1];
        assert!(apply_context_filters(&many, &mut c).is_err());
    }
}
