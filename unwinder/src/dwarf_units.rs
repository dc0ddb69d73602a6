//! DWARF lookups that parse only the compilation units they are asked about.
//!
//! `addr2line::Context::from_dwarf` parses the header, abbreviations and
//! root entry of every unit before its first answer: for Debian's libc
//! debug file (4,126 units) that is a quarter of loading its symbols, most
//! of it allocating abbreviation tables of units no sampled address is in.
//! When a file allows it, [`DwarfLookup::ByUnit`] instead finds an
//! address's unit through `.debug_aranges` and makes a context of that one
//! unit (its own bytes of `.debug_info`, every other section whole) the
//! first time an address in it is looked up.
//!
//! A unit read on its own answers as it does in the whole file only if
//! nothing in it refers to another unit by section offset, so the per-unit
//! mode is used only when the file has no supplementary (dwz) file, every
//! unit is a compilation unit (no partial, type or skeleton units), every
//! one has an address range set in `.debug_aranges`, and no abbreviation
//! uses a form that can refer across units (`DW_FORM_ref_addr`, the dwz
//! and supplementary references) or hides its form (`DW_FORM_indirect`).
//! Anything else gets the whole-file context, as before. Tests: the
//! per-unit answers equal the whole-file ones at every function of libc
//! (unit tests below); `tests/integration_tests/gdb_compare.rs` names
//! libc's inline frames like gdb through this path.

use std::cell::OnceCell;

use gimli::{Reader as _, Section as _};

use crate::elf::DwarfReader as Reader;

/// The DWARF of one module, ready for address lookups.
pub(crate) enum DwarfLookup {
    /// One context over every unit (built by `addr2line` at once).
    Whole(Box<addr2line::Context<Reader>>),
    /// A context per unit, made when first needed.
    ByUnit(Box<ByUnit>),
}

/// Per-unit contexts (see the module docs).
pub(crate) struct ByUnit {
    sections: gimli::DwarfSections<Reader>,
    /// Address ranges `[begin, end)` with the index of their unit, sorted
    /// by `begin`.
    ranges: Vec<(u64, u64, u32)>,
    /// Each unit's bytes in `.debug_info`: offset, length.
    units: Vec<(usize, usize)>,
    contexts: Vec<OnceCell<Option<addr2line::Context<Reader>>>>,
}

impl DwarfLookup {
    /// The lookup for the DWARF in `sections` (with the supplementary
    /// file's, if any): per unit if the file allows it, else whole (`None`
    /// if `addr2line` cannot read it).
    pub(crate) fn new(
        sections: gimli::DwarfSections<Reader>,
        sup: Option<gimli::DwarfSections<Reader>>,
    ) -> Option<DwarfLookup> {
        let sections = match sup {
            None => match ByUnit::new(sections) {
                Ok(by_unit) => return Some(DwarfLookup::ByUnit(Box::new(by_unit))),
                Err(sections) => *sections,
            },
            Some(_) => sections,
        };
        let mut dwarf = sections.borrow(Clone::clone);
        if let Some(sup) = sup {
            dwarf.set_sup(sup.borrow(Clone::clone));
        }
        addr2line::Context::from_dwarf(dwarf)
            .ok()
            .map(|c| DwarfLookup::Whole(Box::new(c)))
    }

    /// The context that answers for `svma` (`None`: no unit covers it).
    pub(crate) fn context_for(&self, svma: u64) -> Option<&addr2line::Context<Reader>> {
        match self {
            DwarfLookup::Whole(c) => Some(c),
            DwarfLookup::ByUnit(u) => u.context_for(svma),
        }
    }
}

impl ByUnit {
    /// Per-unit lookups over `sections`, or `sections` back when the file
    /// does not allow them (see the module docs).
    #[allow(clippy::result_large_err)]
    fn new(
        sections: gimli::DwarfSections<Reader>,
    ) -> Result<ByUnit, Box<gimli::DwarfSections<Reader>>> {
        match Self::index(&sections.borrow(Clone::clone)) {
            Some((units, ranges)) => Ok(ByUnit {
                contexts: (0..units.len()).map(|_| OnceCell::new()).collect(),
                sections,
                ranges,
                units,
            }),
            None => Err(Box::new(sections)),
        }
    }

    /// The units and the address ranges of each, if the file qualifies.
    #[allow(clippy::type_complexity)]
    fn index(dwarf: &gimli::Dwarf<Reader>) -> Option<(Vec<(usize, usize)>, Vec<(u64, u64, u32)>)> {
        if refers_across_units(dwarf) {
            return None;
        }
        let mut units = Vec::new();
        let mut headers = dwarf.units();
        while let Some(h) = headers.next().ok()? {
            if h.type_() != gimli::UnitType::Compilation {
                return None;
            }
            units.push((h.debug_info_offset()?.0, h.length_including_self()));
        }
        if units.is_empty() || u32::try_from(units.len()).is_err() {
            return None;
        }
        let mut covered = vec![false; units.len()];
        let mut ranges = Vec::new();
        let mut sets = dwarf.debug_aranges.headers();
        while let Some(set) = sets.next().ok()? {
            let offset = set.debug_info_offset().0;
            let unit = units.binary_search_by_key(&offset, |u| u.0).ok()?;
            covered[unit] = true;
            let mut entries = set.entries();
            while let Some(e) = entries.next().ok()? {
                if e.length() > 0 {
                    let end = e.address().checked_add(e.length())?;
                    ranges.push((e.address(), end, unit as u32));
                }
            }
        }
        if covered.contains(&false) {
            return None;
        }
        ranges.sort_unstable();
        Some((units, ranges))
    }

    fn context_for(&self, svma: u64) -> Option<&addr2line::Context<Reader>> {
        // Ranges of different units may overlap (code folded by the
        // linker): the nearest ranges starting at or below `svma` are tried.
        let upto = self.ranges.partition_point(|r| r.0 <= svma);
        let (_, _, unit) = self.ranges[..upto]
            .iter()
            .rev()
            .take(8)
            .find(|r| svma < r.1)?;
        let unit = *unit as usize;
        self.contexts[unit]
            .get_or_init(|| self.unit_context(unit))
            .as_ref()
    }

    /// A context over unit `i` alone.
    fn unit_context(&self, i: usize) -> Option<addr2line::Context<Reader>> {
        let (offset, len) = self.units[i];
        let mut one = self.sections.borrow(Clone::clone);
        one.debug_info = self
            .sections
            .debug_info
            .reader()
            .range(offset..offset.checked_add(len)?)
            .into();
        one.debug_aranges = self.sections.debug_aranges.reader().range(0..0).into();
        addr2line::Context::from_dwarf(one).ok()
    }
}

/// Whether any abbreviation of `dwarf` uses a form that may refer to
/// another unit by section offset (or hides its form); unreadable
/// abbreviations count as yes.
fn refers_across_units(dwarf: &gimli::Dwarf<Reader>) -> bool {
    use gimli::constants as c;
    let across = [
        c::DW_FORM_ref_addr,
        c::DW_FORM_GNU_ref_alt,
        c::DW_FORM_ref_sup4,
        c::DW_FORM_ref_sup8,
        c::DW_FORM_indirect,
    ];
    let mut r = dwarf.debug_abbrev.reader().clone();
    scan_forms(&mut r, &across).unwrap_or(true)
}

/// Whether the abbreviation tables read by `r` (one after another, each
/// ended by a zero code) use any of `forms` or a form past `u16`.
fn scan_forms(r: &mut Reader, forms: &[gimli::DwForm]) -> gimli::Result<bool> {
    while !r.is_empty() {
        if r.read_uleb128()? == 0 {
            continue;
        }
        let _tag = r.read_uleb128()?;
        let _children = r.read_u8()?;
        loop {
            let name = r.read_uleb128()?;
            let form = r.read_uleb128()?;
            if name == 0 && form == 0 {
                break;
            }
            let Ok(form) = u16::try_from(form).map(gimli::DwForm) else {
                return Ok(true);
            };
            if forms.contains(&form) {
                return Ok(true);
            }
            if form == gimli::constants::DW_FORM_implicit_const {
                r.read_sleb128()?;
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::SectionBytes;

    fn abbrevs(bytes: &[u8]) -> Reader {
        gimli::EndianReader::new(
            SectionBytes::owned(bytes.to_vec()),
            gimli::RunTimeEndian::Little,
        )
    }

    const ACROSS: [gimli::DwForm; 1] = [gimli::constants::DW_FORM_ref_addr];

    /// A table using `DW_FORM_ref_addr` refers across units; one with only
    /// unit-local forms does not; an implicit constant's value is skipped,
    /// not read as the next attribute; a truncated table is an error.
    #[test]
    fn forms_that_refer_across_units_are_found() {
        // code 1, DW_TAG_compile_unit, children; DW_AT_name DW_FORM_strp;
        // end of attributes; end of table.
        let local = [1, 0x11, 1, 0x03, 0x0e, 0, 0, 0];
        assert!(!scan_forms(&mut abbrevs(&local), &ACROSS).unwrap());
        // The same with a DW_AT_abstract_origin in DW_FORM_ref_addr.
        let across = [1, 0x11, 1, 0x03, 0x0e, 0x31, 0x10, 0, 0, 0];
        assert!(scan_forms(&mut abbrevs(&across), &ACROSS).unwrap());
        // DW_AT_decl_file DW_FORM_implicit_const with value 0x10 (which
        // would read as DW_FORM_ref_addr if it were not skipped), then a
        // second table.
        let implicit = [
            1, 0x2e, 0, 0x3a, 0x21, 0x10, 0, 0, 0, 2, 0x11, 0, 0x03, 0x08, 0, 0, 0,
        ];
        assert!(!scan_forms(&mut abbrevs(&implicit), &ACROSS).unwrap());
        assert!(scan_forms(&mut abbrevs(&[1, 0x11, 1, 0x03]), &ACROSS).is_err());
    }

    /// Against libc6-dbg's DWARF of this process's libc (x86_64: the
    /// aarch64 tests run under qemu with a libc that has no debug file).
    #[cfg(target_arch = "x86_64")]
    mod libc {
        use super::*;

        type Answer = Vec<(Option<String>, Option<String>, Option<u32>)>;

        fn answer(ctx: &addr2line::Context<Reader>, pc: u64) -> Answer {
            let mut out = Vec::new();
            if let Ok(mut frames) = ctx.find_frames(pc).skip_all_loads() {
                while let Ok(Some(f)) = frames.next() {
                    out.push((
                        f.function
                            .and_then(|n| n.raw_name().ok().map(|n| n.into_owned())),
                        f.location.as_ref().and_then(|l| l.file.map(str::to_owned)),
                        f.location.and_then(|l| l.line),
                    ));
                }
            }
            out
        }

        /// At the start and the middle of every function of this process's
        /// libc, the per-unit contexts answer exactly what the whole-file
        /// context does (inline chains, files, lines), from libc6-dbg's DWARF.
        #[test]
        fn per_unit_answers_equal_whole_file_answers_across_libc() {
            use object::{Object, ObjectSymbol};
            let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
            let libc = maps
                .lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| p.contains("/libc.so"))
                .expect("libc in our maps");
            let bytes = std::fs::read(libc).expect("read libc");
            let file = object::File::parse(&*bytes).expect("parse libc");
            let id = file.build_id().ok().flatten().expect("libc's build id");
            let dirs = [std::path::PathBuf::from("/usr/lib/debug")];
            let Some(debug) = crate::debuginfo::find_by_build_id(&dirs, id) else {
                assert!(
                    std::env::var_os("HEAPPROFD_SKIP_GDB_TESTS").is_some(),
                    "no debug file for {libc}: install libc6-dbg (scripts/install-deps.sh)"
                );
                return;
            };
            let dfile = object::File::parse(&**debug.bytes).expect("parse the debug file");
            let sections =
                || crate::symbols::load_sections(&dfile, &debug.bytes).expect("sections");
            let whole =
                addr2line::Context::from_dwarf(sections().borrow(Clone::clone)).expect("whole");
            let Ok(by_unit) = ByUnit::new(sections()) else {
                panic!("libc's debug file qualifies for per-unit lookups");
            };
            let mut checked = 0;
            let mut with_inlines = 0;
            for s in dfile.symbols() {
                if s.kind() != object::SymbolKind::Text || s.size() == 0 {
                    continue;
                }
                for pc in [s.address(), s.address() + s.size() / 2] {
                    let want = answer(&whole, pc);
                    let got = by_unit
                        .context_for(pc)
                        .map(|c| answer(c, pc))
                        .unwrap_or_default();
                    assert_eq!(got, want, "{:?} at {pc:#x}", s.name());
                    checked += 1;
                    with_inlines += usize::from(want.len() > 1);
                }
            }
            assert!(
                checked > 4000 && with_inlines > 100,
                "{checked} pcs, {with_inlines} inlined"
            );
            let made = by_unit
                .contexts
                .iter()
                .filter(|c| c.get().is_some())
                .count();
            assert!(
                made > 1000 && made <= by_unit.units.len(),
                "{made} unit contexts"
            );
        }
    }
}
