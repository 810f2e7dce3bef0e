//! The `tojson` filter as Hugging Face transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`. minijinja's
//! own `tojson` escapes `<`, `>`, `&` and `'` for HTML and writes `,` without a space, so a tool
//! list would render to other bytes (and other token counts) than on the engine.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Nesting deeper than this is refused (Python would hit its recursion limit near 1000).
const MAX_DEPTH: usize = 256;

/// How one `json.dumps` call lays out its output.
struct Layout {
    /// `None`: one line; `Some(unit)`: one item a line, indented by `unit` per level.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// `value | tojson`, `value | tojson(indent=4)`, with `ensure_ascii`, `separators` and
/// `sort_keys` as in Python.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(
                i64::try_from(v.clone())
                    .map_err(|_| invalid("indent must be an integer or a string"))?
                    .clamp(0, 64) as usize,
            ),
        }),
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(pair) if !pair.is_none() => {
            let items: Vec<Value> = pair.try_iter()?.collect();
            match items.as_slice() {
                [item, key] => match (item.as_str(), key.as_str()) {
                    (Some(i), Some(k)) => (i.to_string(), k.to_string()),
                    _ => return Err(invalid("separators must be two strings")),
                },
                _ => return Err(invalid("separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let layout = Layout {
        indent,
        item_separator,
        key_separator,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &layout, 0)?;
    Ok(Value::from(out))
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it.
pub fn dumps(value: &Value) -> Result<String, Error> {
    let layout = Layout {
        indent: None,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        ensure_ascii: false,
        sort_keys: false,
    };
    let mut out = String::new();
    write_value(&mut out, value, &layout, 0)?;
    Ok(out)
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {message}"))
}

fn write_value(
    out: &mut String,
    value: &Value,
    layout: &Layout,
    depth: usize,
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(invalid("value nested too deeply"));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), layout),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), layout, depth, |out, i| {
                items
                    .get(i)
                    .map_or(Ok(()), |item| write_value(out, item, layout, depth + 1))
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if layout.sort_keys {
                keys.sort();
            }
            write_container(out, '{', '}', keys.len(), layout, depth, |out, i| {
                let Some(key) = keys.get(i) else {
                    return Ok(());
                };
                write_key(out, key, layout)?;
                out.push_str(&layout.key_separator);
                write_value(out, &value.get_item(key)?, layout, depth + 1)
            })?;
        }
        ValueKind::Undefined => {
            return Err(invalid("Object of type Undefined is not JSON serializable"))
        }
        kind => {
            return Err(invalid(&format!(
                "Object of type {kind} is not JSON serializable"
            )))
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    layout: &Layout,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&layout.item_separator);
        }
        if let Some(unit) = &layout.indent {
            out.push('\n');
            out.push_str(&unit.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(unit) = &layout.indent {
        out.push('\n');
        out.push_str(&unit.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Python turns non-string keys of a dict into strings (`1` → `"1"`, `True` → `"true"`).
fn write_key(out: &mut String, key: &Value, layout: &Layout) -> Result<(), Error> {
    match key.kind() {
        ValueKind::String => write_string(out, key.as_str().unwrap_or_default(), layout),
        ValueKind::Number | ValueKind::Bool | ValueKind::None => {
            let mut text = String::new();
            write_value(&mut text, key, layout, 0)?;
            write_string(out, &text, layout);
        }
        kind => {
            return Err(invalid(&format!(
                "keys must be str, int, float, bool or None, not {kind}"
            )))
        }
    }
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
    } else {
        out.push_str(&python_float(
            f64::try_from(value.clone()).unwrap_or(f64::NAN),
        ));
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for exponents in
/// [-4, 16), otherwise `d.ddde±XX`.
pub fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits too: `-1.2345e-7`.
    let sci = format!("{v:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else {
            let point = point as usize;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        };
        format!("{sign}{text}")
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.unsigned_abs())
    }
}

fn write_string(out: &mut String, s: &str, layout: &Layout) {
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
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if layout.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, ctx).unwrap()
    }

    #[test]
    fn output_matches_python_json_dumps() {
        let tool: Value = serde_json::from_str(
            r#"{"name": "get_weather", "parameters": {"type": "object", "b": [1, 2.5, 1e-7, 3.0], "a": "<é\n>"}, "n": null, "t": true, "e": [], "o": {}}"#,
        )
        .unwrap();
        let ctx = Value::from_pairs([("tool", tool)]);
        // Python: json.dumps(tool, ensure_ascii=False)
        assert_eq!(
            render("{{ tool | tojson }}", ctx.clone()),
            r#"{"name": "get_weather", "parameters": {"type": "object", "b": [1, 2.5, 1e-07, 3.0], "a": "<é\n>"}, "n": null, "t": true, "e": [], "o": {}}"#
        );
        // Python: json.dumps(tool["parameters"]["b"], indent=2)
        assert_eq!(
            render("{{ tool.parameters.b | tojson(indent=2) }}", ctx.clone()),
            "[\n  1,\n  2.5,\n  1e-07,\n  3.0\n]"
        );
        assert_eq!(
            render("{{ tool.parameters.a | tojson(ensure_ascii=true) }}", ctx),
            r#""<\u00e9\n>""#
        );
    }

    #[test]
    fn floats_read_like_python_repr() {
        for (v, want) in [
            (0.1, "0.1"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (123456789.125, "123456789.125"),
        ] {
            assert_eq!(python_float(v), want, "{v}");
        }
    }

    #[test]
    fn undefined_is_an_error_not_a_null() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        assert!(env.render_str("{{ missing | tojson }}", ()).is_err());
    }
}
