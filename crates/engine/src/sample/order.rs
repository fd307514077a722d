//! The order of the chain's stages (llama.cpp's `--samplers` / `--sampling-seq`,
//! llama-server's `samplers`): names, their aliases and one-letter codes, as llama.cpp 4df29be
//! spells them (`common/sampling.cpp`).

/// One stage of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    Typical,
    TopP,
    MinP,
    Xtc,
    /// The temperature, fixed or dynamic.
    Temperature,
    /// Fill-in-the-middle's cut ([`super::infill`]; not in the default order).
    Infill,
}

/// llama.cpp's default order (`edskypmxt`).
pub const DEFAULT_ORDER: [Stage; 9] =
    [Stage::Penalties, Stage::Dry, Stage::TopNSigma, Stage::TopK, Stage::Typical, Stage::TopP, Stage::MinP, Stage::Xtc, Stage::Temperature];

const ALL: [(Stage, &str, char); 10] = [
    (Stage::Penalties, "penalties", 'e'),
    (Stage::Dry, "dry", 'd'),
    (Stage::TopNSigma, "top_n_sigma", 's'),
    (Stage::TopK, "top_k", 'k'),
    (Stage::Typical, "typ_p", 'y'),
    (Stage::TopP, "top_p", 'p'),
    (Stage::MinP, "min_p", 'm'),
    (Stage::Xtc, "xtc", 'x'),
    (Stage::Temperature, "temperature", 't'),
    (Stage::Infill, "infill", 'i'),
];

/// Stages llama.cpp has and this chain does not.
const UNSUPPORTED: [(&str, char); 1] = [("adaptive_p", 'a')];

/// One entry of an order as given.
#[derive(Clone, Copy, Debug)]
pub enum Item<'a> {
    Name(&'a str),
    Letter(char),
}

/// What a name or letter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    Stage(Stage),
    /// A stage of llama.cpp's that this chain lacks (`adaptive_p`).
    Unsupported(&'static str),
    /// No stage of llama.cpp's (which skips such names with a warning).
    Unknown,
}

impl Stage {
    /// llama.cpp's canonical name.
    pub fn name(self) -> &'static str {
        ALL.iter().find(|s| s.0 == self).map_or("", |s| s.1)
    }

    /// A name, any case: the canonical one, with `-` for `_` or with the `_` dropped, or
    /// `nucleus` (top-p), `temp`, `typ` — llama.cpp's spellings, no others.
    pub fn parse(name: &str) -> Parsed {
        let lower = name.to_ascii_lowercase();
        let same = |canonical: &str| lower == canonical || lower == canonical.replace('_', "-") || lower == canonical.replace('_', "");
        if let Some(s) = ALL.iter().find(|s| same(s.1)) {
            return Parsed::Stage(s.0);
        }
        match lower.as_str() {
            "nucleus" => return Parsed::Stage(Stage::TopP),
            "temp" => return Parsed::Stage(Stage::Temperature),
            "typ" => return Parsed::Stage(Stage::Typical),
            _ => {}
        }
        UNSUPPORTED.iter().find(|u| same(u.0)).map_or(Parsed::Unknown, |u| Parsed::Unsupported(u.0))
    }

    /// One of llama.cpp's letters (`edskypmxt`).
    pub fn from_char(c: char) -> Parsed {
        if let Some(s) = ALL.iter().find(|s| s.2 == c) {
            return Parsed::Stage(s.0);
        }
        UNSUPPORTED.iter().find(|u| u.1 == c).map_or(Parsed::Unknown, |u| Parsed::Unsupported(u.0))
    }

    /// An order from names (`--samplers`, llama-server's `samplers` as an array) or from
    /// letters (`--sampling-seq`, `samplers` as a string). A stage this chain lacks is an
    /// error; a name of no stage is too when `strict`, and is skipped otherwise, as llama.cpp
    /// skips it (clients send names of samplers llama.cpp has since dropped, such as `tfs_z`).
    pub fn parse_order<'a>(items: impl IntoIterator<Item = Item<'a>>, strict: bool) -> Result<Vec<Stage>, String> {
        let mut order = vec![];
        for item in items {
            let (parsed, shown) = match item {
                Item::Name(n) => (Stage::parse(n), format!("{n:?}")),
                Item::Letter(c) => (Stage::from_char(c), format!("'{c}'")),
            };
            match parsed {
                Parsed::Stage(s) => order.push(s),
                Parsed::Unsupported(name) => return Err(format!("the {name} sampler ({shown}) is not supported")),
                Parsed::Unknown if strict => {
                    let known: Vec<String> = ALL.iter().map(|s| format!("{} ({})", s.1, s.2)).collect();
                    return Err(format!("{shown} is no sampler; the samplers are {}", known.join(", ")));
                }
                Parsed::Unknown => {}
            }
        }
        Ok(order)
    }

    /// Does the stage keep the most likely token whatever its setting? (The greedy path
    /// skips those.)
    pub(crate) fn keeps_best(self) -> bool {
        matches!(self, Stage::TopNSigma | Stage::TopK | Stage::TopP | Stage::MinP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_aliases_and_letters() {
        for (s, name, c) in ALL {
            assert_eq!(Stage::parse(name), Parsed::Stage(s));
            assert_eq!(Stage::parse(&name.to_uppercase().replace('_', "-")), Parsed::Stage(s));
            assert_eq!(Stage::from_char(c), Parsed::Stage(s));
            assert_eq!(s.name(), name);
        }
        assert_eq!(Stage::parse("topk"), Parsed::Stage(Stage::TopK));
        assert_eq!(Stage::parse("nucleus"), Parsed::Stage(Stage::TopP));
        assert_eq!(Stage::parse("temp"), Parsed::Stage(Stage::Temperature));
        assert_eq!(Stage::parse("typ"), Parsed::Stage(Stage::Typical));
        assert_eq!(Stage::parse("typical_p"), Parsed::Unknown, "not llama.cpp's");
        assert_eq!(Stage::parse("adaptive-p"), Parsed::Unsupported("adaptive_p"));
        assert_eq!(Stage::from_char('a'), Parsed::Unsupported("adaptive_p"));
        assert_eq!(Stage::parse("tfs_z"), Parsed::Unknown);
        let letters: String = DEFAULT_ORDER.iter().map(|&s| ALL.iter().find(|a| a.0 == s).unwrap().2).collect();
        assert_eq!(letters, "edskypmxt");
    }

    #[test]
    fn orders_skip_unknown_names_unless_strict() {
        let names = ["penalties", "tfs_z", "top-k", "temp"].map(Item::Name);
        assert_eq!(Stage::parse_order(names, false), Ok(vec![Stage::Penalties, Stage::TopK, Stage::Temperature]));
        assert!(Stage::parse_order(names, true).unwrap_err().contains("\"tfs_z\" is no sampler"));
        assert!(Stage::parse_order("kpa".chars().map(Item::Letter), false).unwrap_err().contains("adaptive_p"));
        assert_eq!(Stage::parse_order("edskypmxt".chars().map(Item::Letter), true), Ok(DEFAULT_ORDER.to_vec()));
    }
}
