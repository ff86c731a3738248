//! The minijinja environment that renders HF chat templates as Python's jinja2 does.
//!
//! Settings HF uses: `trim_blocks`, `lstrip_blocks`, no auto-escaping, Python string and dict
//! methods (`.strip()`, `.items()`, … from minijinja-contrib's pycompat). Globals HF templates
//! call: `raise_exception(msg)` and `strftime_now(fmt)`. And HF's `tojson`, which is Python's
//! `json.dumps` (`", "` and `": "` separators, non-ASCII kept) rather than minijinja's
//! HTML-safe compact JSON: tool schemas in prompts must be byte-identical to what the model saw
//! in training.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind, State};

/// Context variable that pins `strftime_now` for reproducible renders.
pub(crate) const NOW_VARIABLE: &str = "__mlxkit_now_unix";

/// A fresh environment with HF's settings and helpers.
pub(crate) fn new_environment() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()?;
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    Ok(env)
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(state: &State, format: String) -> Result<String, minijinja::Error> {
    let unix = match state
        .lookup(NOW_VARIABLE)
        .and_then(|v| i64::try_from(v).ok())
    {
        Some(pinned) => pinned,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    };
    strftime(&format, unix)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Python's `strftime` in UTC for the directives templates use.
pub(crate) fn strftime(format: &str, unix: i64) -> Result<String, minijinja::Error> {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "strftime format ends in %",
            ));
        };
        match directive {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            '-' if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&day.to_string());
            }
            'e' => out.push_str(&format!("{day:>2}")),
            'B' => out.push_str(month_name),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'j' => {
                let jan1 = days_from_civil(year, 1, 1);
                out.push_str(&format!("{:03}", days - jan1 + 1));
            }
            '%' => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime directive %{other} is not supported"),
                ));
            }
        }
    }
    Ok(out)
}

/// Days since 1970-01-01 → (year, month 1–12, day 1–31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// HF's `tojson`: Python `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(value).map_err(|err| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON")
            .with_source(err)
    })?;
    let style = PyJsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

struct PyJsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJsonStyle {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(width) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * level));
        }
    }

    fn write(&self, value: &serde_json::Value, level: usize, out: &mut String) {
        use serde_json::Value as J;
        match value {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => out.push_str(&n.to_string()),
            J::String(s) => self.write_str(s, out),
            J::Array(items) if items.is_empty() => out.push_str("[]"),
            J::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            J::Object(map) if map.is_empty() => out.push_str("{}"),
            J::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write_str(key, out);
                    out.push_str(&self.key_sep);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
        }
    }

    fn write_str(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, ctx: serde_json::Value) -> String {
        let env = new_environment().unwrap();
        env.template_from_str(source)
            .unwrap()
            .render(Value::from(minijinja::value::Serde(&ctx)))
            .unwrap()
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let ctx =
            serde_json::json!({"x": {"b": "<a & b>", "a": [1, 2.5, null, true], "ü": "日本"}});
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()),
            r#"{"b": "<a & b>", "a": [1, 2.5, null, true], "ü": "日本"}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2, sort_keys=true) }}", ctx.clone()),
            "{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"b\": \"<a & b>\",\n  \"ü\": \"日本\"\n}"
        );
        assert_eq!(
            render("{{ x.b | tojson(ensure_ascii=true) }}", ctx.clone()),
            r#""<a & b>""#
        );
        assert_eq!(
            render("{{ x['ü'] | tojson(ensure_ascii=true) }}", ctx),
            r#""\u65e5\u672c""#
        );
    }

    #[test]
    fn strftime_matches_python() {
        // 2024-07-26 13:25:09 UTC was a Friday.
        let t = 1_722_000_309;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%A, %B %-d %H:%M:%S %p %j %%", t).unwrap(),
            "Friday, July 26 13:25:09 PM 208 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400).unwrap(), "2000-02-29");
        assert!(strftime("%Q", t).is_err());
    }

    #[test]
    fn python_methods_loop_controls_and_namespace_work() {
        let out = render(
            "{% set ns = namespace(n=0) %}{% for x in xs %}{% if x == 'skip' %}{% continue %}{% endif %}\
             {% if x == 'stop' %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{{ x.strip().upper() }}\
             {% endfor %}{{ ns.n }}{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}",
            serde_json::json!({"xs": [" a ", "skip", "b", "stop", "c"], "d": {"k": 1}}),
        );
        assert_eq!(out, "AB2k=1");
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let env = new_environment().unwrap();
        let err = env
            .template_from_str("{{ raise_exception('roles must alternate') }}")
            .unwrap()
            .render(Value::UNDEFINED)
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }
}
