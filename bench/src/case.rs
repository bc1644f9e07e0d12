//! What one benchmark case is (procedure × transfer mode × size), how it is written on the command line, and
//! how sizes are parsed and printed.

use std::fmt;
use std::str::FromStr;

/// Largest payload a case may carry (the matrix goes up to 4 MiB).
pub const MAX_SIZE: u32 = 4 << 20;

/// An RDMATEST procedure (spec/TESTPROG.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Proc {
    /// `void NULL(void)`.
    Null,
    /// `opaque ECHO(opaque data<>)`.
    Echo,
    /// `opaque READ(read_args)`: the server sends `size` bytes of `pattern(seed)`.
    Read,
    /// `uint32 WRITE(write_args)`: the client sends `size` bytes of `pattern(seed)`.
    Write,
    /// `void SLEEP(uint32 usec)`: the case's size is the sleep in microseconds.
    Sleep,
    /// `uint32 CALLBACK(callback_args)`: one backward PING of `size` bytes per call.
    Callback,
}

impl Proc {
    /// Every procedure, in program order.
    pub const ALL: [Proc; 6] = [
        Proc::Null,
        Proc::Echo,
        Proc::Read,
        Proc::Write,
        Proc::Sleep,
        Proc::Callback,
    ];

    /// The procedure number in program RDMATEST.
    pub fn number(self) -> u32 {
        match self {
            Proc::Null => 0,
            Proc::Echo => 1,
            Proc::Read => 2,
            Proc::Write => 3,
            Proc::Sleep => 4,
            Proc::Callback => 5,
        }
    }

    /// The lower-case name used on the command line and in case names.
    pub fn name(self) -> &'static str {
        match self {
            Proc::Null => "null",
            Proc::Echo => "echo",
            Proc::Read => "read",
            Proc::Write => "write",
            Proc::Sleep => "sleep",
            Proc::Callback => "callback",
        }
    }

    /// Payload bytes one call moves (counted once per call for MB/s; SLEEP moves none).
    pub fn payload(self, size: u32) -> u64 {
        match self {
            Proc::Null | Proc::Sleep => 0,
            _ => u64::from(size),
        }
    }
}

/// How the app builds the call, named after the RFC 8166 §3.5 transfer mode the daemon will then use.
///
/// The app only decides whether a DDP-eligible argument is reduced and whether it offers a result buffer;
/// whether an unreduced message goes inline or as a Long message depends on its size against the daemon's
/// inline thresholds (recorded in the run's environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Nothing reduced, no result buffer: a short message both ways.
    Inline,
    /// The DDP-eligible argument reduced: a Read chunk.
    ReadChunk,
    /// A result buffer offered for the DDP-eligible result: a Write chunk.
    WriteChunk,
    /// A large argument left unreduced: RDMA_NOMSG with a position-zero Read chunk.
    LongCall,
    /// A large result without a result buffer: a Reply chunk.
    LongReply,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 5] = [
        Mode::Inline,
        Mode::ReadChunk,
        Mode::WriteChunk,
        Mode::LongCall,
        Mode::LongReply,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Inline => "inline",
            Mode::ReadChunk => "read-chunk",
            Mode::WriteChunk => "write-chunk",
            Mode::LongCall => "long-call",
            Mode::LongReply => "long-reply",
        }
    }

    /// Whether `p` has the item this mode needs (TESTPROG's binding table).
    pub fn fits(self, p: Proc) -> bool {
        match self {
            Mode::Inline => true,
            Mode::ReadChunk | Mode::LongCall => matches!(p, Proc::Echo | Proc::Write),
            Mode::WriteChunk | Mode::LongReply => matches!(p, Proc::Echo | Proc::Read),
        }
    }
}

/// One benchmark case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Case {
    /// The procedure called.
    pub proc_: Proc,
    /// How the call is built.
    pub mode: Mode,
    /// Payload bytes (microseconds for SLEEP; 0 for NULL).
    pub size: u32,
}

/// Why a case, size or duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

fn err<T>(s: String) -> Result<T, ParseError> {
    Err(ParseError(s))
}

/// Parses a byte size: a number with an optional binary suffix (`B`, `K`/`KiB`, `M`/`MiB`), e.g. `64`,
/// `4KiB`, `1M`.
pub fn parse_size(s: &str) -> Result<u32, ParseError> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        _ => return err(format!("bad size unit in {s:?} (use B, KiB or MiB)")),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| ParseError(format!("bad size {s:?}")))?;
    match n.checked_shl(shift).filter(|v| *v <= u64::from(MAX_SIZE)) {
        Some(v) => Ok(v as u32),
        None => err(format!("size {s:?} is over the 4 MiB maximum")),
    }
}

/// Prints a byte size in the largest binary unit that divides it (`0`, `64`, `4KiB`, `1MiB`, `1000`).
pub fn format_size(n: u64) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{}MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{}KiB", n >> 10)
    } else {
        n.to_string()
    }
}

/// Parses a duration: a number with `ms` or `s` (`500ms`, `2s`, `1.5s`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, ParseError> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return err(format!("bad duration {s:?} (use e.g. 500ms or 2s)"));
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale <= 86_400.0 => {
            Ok(std::time::Duration::from_secs_f64(v * scale))
        }
        _ => err(format!("bad duration {s:?}")),
    }
}

/// Parses a rate in calls per second: a positive number, optionally with `k` (10^3) or `M`
/// (10^6), e.g. `50000`, `200k`, `1.5M`; at most 10^9.
pub fn parse_rate(s: &str) -> Result<f64, ParseError> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix('k') {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix('M') {
        (n, 1e6)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale <= 1e9 => Ok(v * scale),
        _ => err(format!(
            "bad rate {s:?} (calls per second above 0, e.g. 50000, 200k or 1.5M)"
        )),
    }
}

impl FromStr for Proc {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Proc, ParseError> {
        Proc::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseError(format!("unknown procedure {s:?}")))
    }
}

impl FromStr for Mode {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Mode, ParseError> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseError(format!("unknown transfer mode {s:?}")))
    }
}

impl FromStr for Case {
    type Err = ParseError;

    /// `PROC/MODE/SIZE`, e.g. `echo/inline/64`, `read/write-chunk/1MiB`; `null` alone means `null/inline/0`.
    fn from_str(s: &str) -> Result<Case, ParseError> {
        let parts: Vec<&str> = s.split('/').collect();
        let (p, m, z) = match parts.as_slice() {
            [p] => (*p, "inline", "0"),
            [p, m, z] => (*p, *m, *z),
            _ => return err(format!("bad case {s:?} (want PROC/MODE/SIZE)")),
        };
        Case::new(p.parse()?, m.parse()?, parse_size(z)?)
    }
}

impl Case {
    /// A checked case: the mode must fit the procedure, NULL has size 0, SLEEP at most one second.
    pub fn new(proc_: Proc, mode: Mode, size: u32) -> Result<Case, ParseError> {
        if !mode.fits(proc_) {
            return err(format!(
                "{} has no item for {} (see spec/TESTPROG.md's binding)",
                proc_.name(),
                mode.name()
            ));
        }
        if proc_ == Proc::Null && size != 0 {
            return err("null carries no data: its size must be 0".into());
        }
        if proc_ == Proc::Sleep && size > 1_000_000 {
            return err("sleep is capped at 1000000 us".into());
        }
        Ok(Case { proc_, mode, size })
    }

    /// The name used in tables, JSON and `.hlog` tags (never contains a space or comma).
    pub fn name(&self) -> String {
        format!(
            "{}/{}/{}",
            self.proc_.name(),
            self.mode.name(),
            format_size(u64::from(self.size))
        )
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The named case lists: `quick` (a few seconds in CI), `default` and `full` (every mode, 0 B..4 MiB).
pub fn matrix(name: &str) -> Result<Vec<Case>, ParseError> {
    let list: &[&str] = match name {
        "quick" => &[
            "null",
            "echo/inline/64",
            "echo/read-chunk/64KiB",
            "echo/write-chunk/64KiB",
            "write/read-chunk/1MiB",
            "read/write-chunk/1MiB",
            "write/long-call/64KiB",
            "read/long-reply/64KiB",
            "sleep/inline/100",
            "callback/inline/64",
        ],
        "default" => &[
            "null",
            "echo/inline/64",
            "echo/inline/1KiB",
            "write/read-chunk/4KiB",
            "write/read-chunk/64KiB",
            "write/read-chunk/1MiB",
            "read/write-chunk/4KiB",
            "read/write-chunk/64KiB",
            "read/write-chunk/1MiB",
            "write/long-call/64KiB",
            "read/long-reply/64KiB",
            "callback/inline/64",
        ],
        "full" => {
            let mut v = vec![Case::new(Proc::Null, Mode::Inline, 0)?];
            for size in [64, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 4 << 20] {
                for (p, m) in [
                    (Proc::Echo, Mode::Inline),
                    (Proc::Echo, Mode::ReadChunk),
                    (Proc::Echo, Mode::WriteChunk),
                    (Proc::Write, Mode::ReadChunk),
                    (Proc::Read, Mode::WriteChunk),
                    (Proc::Write, Mode::LongCall),
                    (Proc::Read, Mode::LongReply),
                ] {
                    v.push(Case::new(p, m, size)?);
                }
            }
            v.push(Case::new(Proc::Callback, Mode::Inline, 64)?);
            return Ok(v);
        }
        _ => return err(format!("unknown matrix {name:?} (quick, default, full)")),
    };
    list.iter().map(|s| s.parse()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_reject_garbage() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("64B"), Ok(64));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert!(parse_size("5MiB").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("1GiB").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("12x").is_err());
    }

    #[test]
    fn rates_take_decimal_k_and_m_and_refuse_zero_negative_and_huge() {
        assert_eq!(parse_rate("50000"), Ok(50_000.0));
        assert_eq!(parse_rate("200k"), Ok(200_000.0));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000.0));
        assert_eq!(parse_rate(" 0.5 "), Ok(0.5));
        for bad in ["0", "-1k", "", "k", "2G", "1e10", "nan", "inf"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_format_in_the_largest_exact_unit_and_round_trip() {
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(4 << 20), "4MiB");
        for n in [0u32, 1, 64, 1000, 4096, 65536, 1 << 20, 3 << 20, 4 << 20] {
            assert_eq!(parse_size(&format_size(u64::from(n))), Ok(n));
        }
    }

    #[test]
    fn durations_parse_in_ms_and_s() {
        assert_eq!(
            parse_duration("500ms"),
            Ok(std::time::Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration("1.5s"),
            Ok(std::time::Duration::from_millis(1500))
        );
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("nans").is_err());
        assert!(parse_duration("1e9s").is_err());
    }

    #[test]
    fn cases_parse_and_print_as_the_same_name() {
        let c: Case = "read/write-chunk/1MiB".parse().unwrap();
        assert_eq!(
            c,
            Case {
                proc_: Proc::Read,
                mode: Mode::WriteChunk,
                size: 1 << 20
            }
        );
        assert_eq!(c.name(), "read/write-chunk/1MiB");
        assert_eq!("NULL".parse::<Case>().unwrap().name(), "null/inline/0");
        for m in ["quick", "default", "full"] {
            for c in matrix(m).unwrap() {
                assert_eq!(c.name().parse::<Case>(), Ok(c));
                assert!(!c.name().contains([' ', ',']));
            }
        }
    }

    #[test]
    fn cases_whose_mode_has_no_item_in_the_binding_are_refused() {
        assert!("read/read-chunk/64".parse::<Case>().is_err());
        assert!("write/write-chunk/64".parse::<Case>().is_err());
        assert!("read/long-call/64".parse::<Case>().is_err());
        assert!("write/long-reply/64".parse::<Case>().is_err());
        assert!("null/read-chunk/0".parse::<Case>().is_err());
        assert!("null/inline/64".parse::<Case>().is_err());
        assert!("sleep/inline/2000000".parse::<Case>().is_err());
        assert!("echo/inline".parse::<Case>().is_err());
        assert!("fetch/inline/0".parse::<Case>().is_err());
        assert!("echo/sideways/0".parse::<Case>().is_err());
    }

    #[test]
    fn the_full_matrix_covers_every_mode_and_both_size_ends() {
        let full = matrix("full").unwrap();
        for m in Mode::ALL {
            assert!(full.iter().any(|c| c.mode == m), "{}", m.name());
        }
        assert!(full.iter().any(|c| c.size == 0));
        assert!(full.iter().any(|c| c.size == MAX_SIZE));
        assert!(matrix("nope").is_err());
    }
}
