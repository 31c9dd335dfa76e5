//! Mimir's native tool-call syntax (Gemma-4's): `<|tool_call>call:NAME{ARGS}<tool_call|>`, the
//! arguments an object in Gemma's argument dialect — bare keys, strings between `<|"|>` tokens
//! with no escapes, numbers, booleans and null as in JSON (`{city:<|"|>Oslo<|"|>,days:3}`).
//!
//! llguidance compiles JSON Schema into JSON's own syntax only, so this file translates a
//! tool's `parameters` schema into a Lark grammar over the dialect (scalars reuse llguidance's
//! JSON compiler through `%json`, whose number, boolean and null syntax the dialect shares);
//! turns a finished call's arguments into JSON (`args_to_json`); and follows a constrained
//! reply token by token to tell text from call markup (`CallTracker`).

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Token ids of the call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolTokens {
    pub call_open: u32,
    pub call_close: u32,
    pub response_open: u32,
    pub quote: u32,
}

/// Which calls a reply may or must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    Required,
    Named(String),
}

/// A declared tool as the grammar needs it.
#[derive(Debug, Clone)]
pub struct ToolDecl {
    pub name: String,
    /// The `parameters` schema (None: no parameters declared, any object).
    pub parameters: Option<Value>,
    /// Hold the arguments to `parameters` (the default); false: any well-formed object.
    pub strict: bool,
}

/// A schema the dialect grammar cannot express, naming the keyword and where it sits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

/// Keywords that only annotate (they constrain nothing).
const ANNOTATIONS: &[&str] = &["title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"];
/// Keywords of numbers, booleans and null that llguidance's JSON compiler enforces for them.
const SCALAR_KEYWORDS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
const HANDLED: &[&str] = &[
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "anyOf", "oneOf", "allOf", "$ref", "nullable", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
];

/// The Lark grammar of a whole reply under `choice`: free text and then calls (`Auto`), or
/// calls only (`Required`, `Named`: every call to that function); one call at most unless
/// `parallel`; after the calls, the end of the turn or `<|tool_response>`.
pub fn reply_grammar(tools: &[ToolDecl], choice: &ToolChoice, parallel: bool, ids: ToolTokens) -> Result<String, SchemaError> {
    let mut g = Grammar::new(ids.quote);
    let mut fns = vec![];
    for (i, t) in tools.iter().enumerate() {
        if matches!(choice, ToolChoice::Named(n) if *n != t.name) {
            continue;
        }
        let args = match (&t.parameters, t.strict) {
            (Some(schema), true) => g.root(schema, &format!("tools[{i}].function.parameters"))?,
            _ => "g_object".to_string(),
        };
        let rule = format!("fn_{i}");
        g.rules.push(format!("{rule}: {} {args}", lark_str(&t.name)));
        fns.push(rule);
    }
    let calls = if parallel { "call+" } else { "call" };
    let body = match choice {
        ToolChoice::Auto => format!("TEXT | TEXT? {calls} <[{}]>?", ids.response_open),
        _ => format!("{calls} <[{}]>?", ids.response_open),
    };
    let mut out = String::from("%llguidance {}\n");
    out.push_str(&format!("start: {body}\nTEXT: /(?s:.+)/\n"));
    out.push_str(&format!("call: <[{}]> \"call:\" ({}) <[{}]>\n", ids.call_open, fns.join(" | "), ids.call_close));
    out.push_str(&g.finish());
    Ok(out)
}

/// The grammar of one `parameters` schema's object alone (for tests and the fuzz target).
pub fn args_grammar(schema: &Value, quote: u32) -> Result<String, SchemaError> {
    let mut g = Grammar::new(quote);
    let root = g.root(schema, "parameters")?;
    Ok(format!("%llguidance {{}}\nstart: {root}\n{}", g.finish()))
}

/// A Lark string literal (JSON's escapes, which llguidance's Lark reads).
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

struct Grammar<'a> {
    quote: u32,
    rules: Vec<String>,
    next: usize,
    /// `$ref` targets already given a rule, by reference.
    refs: BTreeMap<String, String>,
    root: Option<&'a Value>,
}

impl<'a> Grammar<'a> {
    fn new(quote: u32) -> Self {
        Grammar { quote, rules: vec![], next: 0, refs: BTreeMap::new(), root: None }
    }

    /// The generic dialect (any value) and what the rules reference.
    fn finish(self) -> String {
        let q = self.quote;
        let mut out = self.rules.join("\n");
        out.push('\n');
        out.push_str(&format!(
            "g_value: g_object | g_array | g_string | G_NUMBER | \"true\" | \"false\" | \"null\"
g_object: \"{{\" (g_member (\",\" g_member)*)? \"}}\"
g_member: G_KEY \":\" g_value
g_array: \"[\" (g_value (\",\" g_value)*)? \"]\"
g_string: <[{q}]> G_TEXT? <[{q}]>
G_TEXT: /(?s:.+)/
G_KEY: /[A-Za-z_][A-Za-z0-9_]*/
G_NUMBER: /-?(0|[1-9][0-9]{{0,15}})(\\.[0-9]{{1,16}})?([eE][+-]?[0-9]{{1,2}})?/
G_INTEGER: /-?(0|[1-9][0-9]{{0,15}})/
"
        ));
        out
    }

    fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}_{}", self.next)
    }

    /// The rule for an object schema at the top of a tool's arguments (must describe objects).
    fn root(&mut self, schema: &'a Value, path: &str) -> Result<String, SchemaError> {
        self.root = Some(schema);
        let err = |m: &str| SchemaError { path: path.to_string(), message: m.to_string() };
        match schema {
            Value::Object(o) if o.get("type").is_none_or(|t| t == "object") => self.value(schema, path),
            Value::Object(_) => Err(err("the arguments of a call are an object: `type` must be \"object\"")),
            _ => Err(err("must be a JSON Schema object")),
        }
    }

    /// A Lark expression for any value `schema` allows.
    fn value(&mut self, schema: &'a Value, path: &str) -> Result<String, SchemaError> {
        let err = |m: String| SchemaError { path: path.to_string(), message: m };
        let o = match schema {
            Value::Bool(true) => return Ok("g_value".into()),
            Value::Bool(false) => return Err(err("the schema `false` allows no value".into())),
            Value::Object(o) => o,
            _ => return Err(err("a schema must be an object or a boolean".into())),
        };
        if let Some(k) = o.keys().find(|k| !HANDLED.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str())) {
            return Err(err(format!("keyword `{k}` is not supported in tool arguments (Gemma's argument syntax); set \"strict\": false on the tool to accept any well-formed arguments")));
        }
        if let Some(r) = o.get("$ref") {
            if o.keys().any(|k| !ANNOTATIONS.contains(&k.as_str()) && k != "$ref") {
                return Err(err("`$ref` beside other keywords is not supported".into()));
            }
            return self.reference(r, path);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key) {
                let alts = alts.as_array().filter(|a| !a.is_empty()).ok_or_else(|| err(format!("`{key}` must be a non-empty list")))?;
                if o.keys().any(|k| !ANNOTATIONS.contains(&k.as_str()) && k != key) {
                    return Err(err(format!("`{key}` beside other keywords is not supported")));
                }
                let parts: Result<Vec<String>, _> = alts.iter().enumerate().map(|(i, s)| self.value(s, &format!("{path}.{key}[{i}]"))).collect();
                return Ok(format!("({})", parts?.join(" | ")));
            }
        }
        if let Some(all) = o.get("allOf") {
            match all.as_array().map(Vec::as_slice) {
                Some([only]) if o.keys().all(|k| ANNOTATIONS.contains(&k.as_str()) || k == "allOf") => return self.value(only, &format!("{path}.allOf[0]")),
                _ => return Err(err("`allOf` is supported with one schema and nothing beside it".into())),
            }
        }
        if let Some(c) = o.get("const") {
            return self.literal(c);
        }
        if let Some(e) = o.get("enum") {
            let vals = e.as_array().filter(|a| !a.is_empty()).ok_or_else(|| err("`enum` must be a non-empty list".into()))?;
            let lits: Result<Vec<String>, _> = vals.iter().map(|v| self.literal(v)).collect();
            return Ok(format!("({})", lits?.join(" | ")));
        }
        let mut types: Vec<String> = match o.get("type") {
            None => vec![],
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts.iter().map(|t| t.as_str().map(str::to_string).ok_or_else(|| err("`type` entries must be strings".into()))).collect::<Result<_, _>>()?,
            Some(_) => return Err(err("`type` must be a string or a list of strings".into())),
        };
        if o.get("nullable") == Some(&Value::Bool(true)) && !types.is_empty() && !types.iter().any(|t| t == "null") {
            types.push("null".into());
        }
        if types.is_empty() {
            // No type: what the keywords present imply, else any value.
            if o.contains_key("properties") || o.contains_key("required") || o.contains_key("additionalProperties") {
                types.push("object".into());
            } else if o.contains_key("items") || o.contains_key("minItems") || o.contains_key("maxItems") {
                types.push("array".into());
            } else if ["minLength", "maxLength", "pattern", "format"].iter().any(|k| o.contains_key(*k)) {
                types.push("string".into());
            } else if SCALAR_KEYWORDS.iter().any(|k| o.contains_key(*k)) {
                types.push("number".into());
            } else {
                return Ok("g_value".into());
            }
        }
        let mut alts = vec![];
        for t in &types {
            alts.push(match t.as_str() {
                "object" => self.object(o, path)?,
                "array" => self.array(o, path)?,
                "string" => self.string(o, path)?,
                "integer" | "number" => self.scalar(o, t),
                "boolean" => "(\"true\" | \"false\")".into(),
                "null" => "\"null\"".into(),
                other => return Err(err(format!("unknown type `{other}`"))),
            });
        }
        Ok(if alts.len() == 1 { alts.remove(0) } else { format!("({})", alts.join(" | ")) })
    }

    /// `#`, `#/$defs/NAME` or `#/definitions/NAME`, one rule per target (recursion allowed).
    fn reference(&mut self, r: &Value, path: &str) -> Result<String, SchemaError> {
        let err = |m: String| SchemaError { path: path.to_string(), message: m };
        let r = r.as_str().ok_or_else(|| err("`$ref` must be a string".into()))?;
        if let Some(rule) = self.refs.get(r) {
            return Ok(rule.clone());
        }
        let root = self.root.expect("root() sets the root");
        let target = if r == "#" {
            root
        } else {
            let name = r.strip_prefix("#/$defs/").map(|n| ("$defs", n)).or_else(|| r.strip_prefix("#/definitions/").map(|n| ("definitions", n)));
            let (section, name) = name.ok_or_else(|| err(format!("`$ref` {r:?}: only #, #/$defs/NAME and #/definitions/NAME are supported")))?;
            root.get(section).and_then(|d| d.get(name)).ok_or_else(|| err(format!("`$ref` {r:?} names no definition")))?
        };
        let rule = self.fresh("ref");
        self.refs.insert(r.to_string(), rule.clone());
        let body = self.value(target, &format!("{path}.$ref"))?;
        self.rules.push(format!("{rule}: {body}"));
        Ok(rule)
    }

    /// An object: the declared properties in sorted order (as the chat template renders
    /// arguments), required ones present, optional ones omissible; other keys only where
    /// `additionalProperties` allows them, after the declared ones.
    fn object(&mut self, o: &'a Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let err = |m: String| SchemaError { path: path.to_string(), message: m };
        let props: Option<&'a Map<String, Value>> = match o.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(err("`properties` must be an object".into())),
        };
        let declares = |k: &str| props.is_some_and(|p| p.contains_key(k));
        let required: Vec<&str> = match o.get("required") {
            None => vec![],
            Some(Value::Array(r)) => r.iter().map(|x| x.as_str().ok_or_else(|| err("`required` entries must be strings".into()))).collect::<Result<_, _>>()?,
            Some(_) => return Err(err("`required` must be a list".into())),
        };
        if let Some(missing) = required.iter().find(|r| !declares(r)) {
            if o.get("additionalProperties") == Some(&Value::Bool(false)) || !o.contains_key("additionalProperties") {
                return Err(err(format!("`required` names `{missing}`, which `properties` does not declare")));
            }
            return Err(err(format!("`required` names `{missing}` outside `properties`; declare it there")));
        }
        let extra = match o.get("additionalProperties") {
            None | Some(Value::Bool(false)) => None,
            Some(s) => Some(self.value(s, &format!("{path}.additionalProperties"))?),
        };
        let mut keys: Vec<&'a String> = props.map(|p| p.keys().collect()).unwrap_or_default();
        keys.sort();
        let mut members = vec![];
        for k in &keys {
            if k.is_empty() || !k.chars().all(|c| c.is_alphanumeric() || "_-.$".contains(c)) {
                return Err(err(format!("property name {k:?} cannot be written in Gemma's argument syntax (letters, digits, _, -, ., $)")));
            }
            let v = self.value(&props.expect("keys come from properties")[k.as_str()], &format!("{path}.properties.{k}"))?;
            let member = self.fresh("member");
            self.rules.push(format!("{member}: {} {v}", lark_str(&format!("{k}:"))));
            members.push((member, required.contains(&k.as_str())));
        }
        // Members i.. as Lark expressions: `first` writes at least one of them (None: none are
        // left to write), `rest` follows a written member (None: nothing may follow).
        let (mut first, mut rest): (Option<String>, Option<String>) = match &extra {
            None => (None, None),
            Some(v) => {
                let key = self.fresh("EXTRA_KEY").to_uppercase();
                let declared: Vec<String> = keys.iter().map(|k| lark_str(k)).collect();
                let exclude = if declared.is_empty() { String::new() } else { format!(" & ~({})", declared.join(" | ")) };
                self.rules.push(format!("{key}: /[A-Za-z_][A-Za-z0-9_]*/{exclude}"));
                let kv = self.fresh("extra");
                self.rules.push(format!("{kv}: {key} \":\" {v}"));
                (Some(format!("({kv} (\",\" {kv})*)")), Some(format!("(\",\" {kv})*")))
            }
        };
        let mut all_optional = true;
        for (member, req) in members.iter().rev() {
            let after = rest.clone().map(|r| format!(" {r}")).unwrap_or_default();
            let here = format!("{member}{after}");
            let (f, r) = (self.fresh("first"), self.fresh("rest"));
            if *req {
                all_optional = false;
                self.rules.push(format!("{f}: {here}"));
                self.rules.push(format!("{r}: \",\" {here}"));
            } else {
                match &first {
                    Some(prev) => self.rules.push(format!("{f}: {here} | {prev}")),
                    None => self.rules.push(format!("{f}: {here}")),
                }
                self.rules.push(format!("{r}: (\",\" {member})?{after}"));
            }
            first = Some(f);
            rest = Some(r);
        }
        Ok(match first {
            None => "(\"{\" \"}\")".to_string(),
            Some(f) if all_optional => format!("(\"{{\" {f}? \"}}\")"),
            Some(f) => format!("(\"{{\" {f} \"}}\")"),
        })
    }

    fn array(&mut self, o: &'a Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let err = |m: String| SchemaError { path: path.to_string(), message: m };
        let item = match o.get("items") {
            None => "g_value".to_string(),
            Some(s @ (Value::Object(_) | Value::Bool(_))) => self.value(s, &format!("{path}.items"))?,
            Some(_) => return Err(err("`items` must be one schema (prefixItems and tuple forms are not supported)".into())),
        };
        let count = |k: &str| o.get(k).map(|v| v.as_u64().ok_or_else(|| err(format!("`{k}` must be a non-negative integer")))).transpose();
        let (min, max) = (count("minItems")?.unwrap_or(0), count("maxItems")?);
        if max.is_some_and(|m| m < min) {
            return Err(err("`maxItems` is below `minItems`".into()));
        }
        if max.is_some_and(|m| m > 1024) || min > 1024 {
            return Err(err("`minItems`/`maxItems` above 1024 are not supported".into()));
        }
        let more = match max {
            Some(m) => format!("(\",\" {item}){{{},{}}}", min.saturating_sub(1), m.saturating_sub(1)),
            None => format!("(\",\" {item}){{{},}}", min.saturating_sub(1)),
        };
        let list = format!("{item} {more}");
        Ok(match (min, max) {
            (_, Some(0)) => "(\"[\" \"]\")".into(),
            (0, _) => format!("(\"[\" ({list})? \"]\")"),
            _ => format!("(\"[\" {list} \"]\")"),
        })
    }

    /// A string: `<|"|>` text `<|"|>`, the text held to minLength/maxLength (characters),
    /// `pattern` (found anywhere, as JSON Schema reads it, unless anchored) and a few formats.
    fn string(&mut self, o: &'a Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let err = |m: String| SchemaError { path: path.to_string(), message: m };
        let q = self.quote;
        let len = |k: &str| o.get(k).map(|v| v.as_u64().ok_or_else(|| err(format!("`{k}` must be a non-negative integer")))).transpose();
        let (min, max) = (len("minLength")?.unwrap_or(0), len("maxLength")?);
        if max.is_some_and(|m| m < min) {
            return Err(err("`maxLength` is below `minLength`".into()));
        }
        if max.is_some_and(|m| m > 10_000) || min > 10_000 {
            return Err(err("`minLength`/`maxLength` above 10000 are not supported".into()));
        }
        let mut parts = vec![];
        if min > 0 || max.is_some() {
            parts.push(format!("/(?s:.{{{min},{}}})/", max.map(|m| m.to_string()).unwrap_or_default()));
        }
        if let Some(p) = o.get("pattern") {
            let p = p.as_str().ok_or_else(|| err("`pattern` must be a string".into()))?;
            let (head, tail) = (if p.starts_with('^') { "" } else { "(?s:.*)" }, if p.ends_with('$') && !p.ends_with("\\$") { "" } else { "(?s:.*)" });
            let core = p.strip_prefix('^').unwrap_or(p);
            let core = if tail.is_empty() { &core[..core.len() - 1] } else { core };
            parts.push(format!("/{head}(?:{}){tail}/", llguidance::regex_to_lark(core, "dw")));
        }
        if let Some(f) = o.get("format") {
            let f = f.as_str().ok_or_else(|| err("`format` must be a string".into()))?;
            let rx = match f {
                "date" => r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
                "time" => r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?",
                "date-time" => r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
                "uuid" => r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
                "email" => r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}",
                "ipv4" => r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
                other => return Err(err(format!("format `{other}` is not supported (date, time, date-time, uuid, email, ipv4 are)"))),
            };
            parts.push(format!("/{rx}/"));
        }
        if parts.is_empty() {
            return Ok("g_string".into());
        }
        // A terminal never matches the empty string: the empty text is the optional rule's.
        parts.push("/(?s:.+)/".into());
        let name = self.fresh("STR").to_uppercase();
        self.rules.push(format!("{name}: {}", parts.join(" & ")));
        let optional = if min == 0 && o.get("pattern").is_none() && o.get("format").is_none() { "?" } else { "" };
        Ok(format!("(<[{q}]> {name}{optional} <[{q}]>)"))
    }

    /// A number: with bounds or `multipleOf`, through llguidance's JSON compiler (the
    /// dialect's numbers are JSON's), a missing bound set to ±1e15; without, the dialect's own
    /// syntax. Either way every number fits an f64, as the arguments' JSON must.
    fn scalar(&mut self, o: &Map<String, Value>, ty: &str) -> String {
        if !SCALAR_KEYWORDS.iter().any(|k| o.contains_key(*k)) {
            return if ty == "integer" { "G_INTEGER".into() } else { "G_NUMBER".into() };
        }
        let mut s = Map::new();
        s.insert("type".into(), Value::String(ty.into()));
        for k in SCALAR_KEYWORDS {
            if let Some(v) = o.get(*k) {
                s.insert((*k).into(), v.clone());
            }
        }
        if !s.contains_key("minimum") && !s.contains_key("exclusiveMinimum") {
            s.insert("minimum".into(), serde_json::json!(-1e15));
        }
        if !s.contains_key("maximum") && !s.contains_key("exclusiveMaximum") {
            s.insert("maximum".into(), serde_json::json!(1e15));
        }
        format!("%json {}", Value::Object(s))
    }

    /// One fixed value in the dialect.
    fn literal(&mut self, v: &Value) -> Result<String, SchemaError> {
        let q = self.quote;
        Ok(match v {
            Value::String(s) if s.is_empty() => format!("(<[{q}]> <[{q}]>)"),
            Value::String(s) => format!("(<[{q}]> {} <[{q}]>)", lark_str(s)),
            Value::Array(a) => {
                let items: Result<Vec<String>, _> = a.iter().map(|x| self.literal(x)).collect();
                format!("(\"[\" {} \"]\")", items?.join(" \",\" "))
            }
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                let members: Result<Vec<String>, _> = keys.iter().map(|k| Ok(format!("{} {}", lark_str(&format!("{k}:")), self.literal(&o[k.as_str()])?))).collect();
                format!("(\"{{\" {} \"}}\")", members?.join(" \",\" "))
            }
            other => lark_str(&other.to_string()),
        })
    }
}

/// The byte that stands for the `<|"|>` token in the bytes `CallTracker` collects: 0xFF is
/// never part of UTF-8, and the grammar's strings are UTF-8 text.
pub const QUOTE: u8 = 0xFF;

/// Parses a call's arguments (`{…}` with `QUOTE` for each `<|"|>`) into JSON.
pub fn args_to_json(bytes: &[u8]) -> Result<Value, String> {
    let mut p = ArgParser { b: bytes, i: 0, depth: 0 };
    let v = p.value()?;
    if p.i != bytes.len() {
        return Err(format!("trailing bytes at {}", p.i));
    }
    Ok(v)
}

struct ArgParser<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
}

impl ArgParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at {}", c as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        self.depth += 1;
        if self.depth > 128 {
            return Err("nested deeper than 128".into());
        }
        let v = self.value_inner();
        self.depth -= 1;
        v
    }

    fn value_inner(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some(b'{') => {
                self.i += 1;
                let mut m = Map::new();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Value::Object(m));
                }
                loop {
                    let start = self.i;
                    while self.peek().is_some_and(|b| b != b':') {
                        self.i += 1;
                    }
                    let key = String::from_utf8_lossy(&self.b[start..self.i]).into_owned();
                    self.eat(b':')?;
                    m.insert(key, self.value()?);
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Value::Object(m));
                        }
                        _ => return Err(format!("expected , or }} at {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut a = vec![];
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Value::Array(a));
                }
                loop {
                    a.push(self.value()?);
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Value::Array(a));
                        }
                        _ => return Err(format!("expected , or ] at {}", self.i)),
                    }
                }
            }
            Some(QUOTE) => {
                self.i += 1;
                let start = self.i;
                while self.peek().is_some_and(|b| b != QUOTE) {
                    self.i += 1;
                }
                let s = String::from_utf8_lossy(&self.b[start..self.i]).into_owned();
                self.eat(QUOTE)?;
                Ok(Value::String(s))
            }
            Some(_) => {
                let start = self.i;
                while self.peek().is_some_and(|b| !matches!(b, b',' | b'}' | b']')) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?;
                serde_json::from_str(text).map_err(|e| format!("bad literal {text:?}: {e}"))
            }
            None => Err("unexpected end".into()),
        }
    }
}

/// What a token of a constrained tool reply was.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    /// Plain text: decode and stream it.
    Text,
    /// Part of a call's markup: nothing to stream yet.
    Markup,
    /// A call's function name is known.
    Name(String),
    /// A call is complete: its arguments as JSON.
    Call { name: String, arguments: Value },
    /// `<|tool_response>`: the turn ends after its calls.
    End,
}

#[derive(Debug, Clone)]
enum Phase {
    Text,
    /// After `<|tool_call>`: the bytes of `call:NAME{` so far.
    Name(Vec<u8>),
    /// Inside the arguments: the bytes from `{` on.
    Args { name: String, bytes: Vec<u8> },
    /// After `<tool_call|>`.
    After,
}

/// Follows a reply the tool grammar constrains, token by token. The grammar guarantees the
/// syntax; the tracker only splits text from calls and parses each finished call.
#[derive(Debug, Clone)]
pub struct CallTracker {
    ids: ToolTokens,
    phase: Phase,
    /// Calls completed so far.
    pub calls: usize,
}

impl CallTracker {
    pub fn new(ids: ToolTokens) -> Self {
        CallTracker { ids, phase: Phase::Text, calls: 0 }
    }

    /// Inside a call's markup, or after calls (nothing there is streamed as text).
    pub fn in_call(&self) -> bool {
        !matches!(self.phase, Phase::Text)
    }

    /// Between or after complete calls, where running out of budget still leaves whole calls.
    pub fn after_call(&self) -> bool {
        matches!(self.phase, Phase::After)
    }

    /// Advances past `token`, whose bytes are `bytes` (`Tokenizer::token_bytes`).
    pub fn advance(&mut self, token: u32, bytes: &[u8]) -> CallEvent {
        let ids = self.ids;
        let phase = std::mem::replace(&mut self.phase, Phase::After);
        let (next, ev) = match phase {
            Phase::Text | Phase::After if token == ids.call_open => (Phase::Name(vec![]), CallEvent::Markup),
            Phase::Text => (Phase::Text, CallEvent::Text),
            Phase::After if token == ids.response_open => (Phase::After, CallEvent::End),
            Phase::After => (Phase::After, CallEvent::Markup),
            Phase::Name(mut sofar) => {
                sofar.extend_from_slice(bytes);
                match sofar.iter().position(|&b| b == b'{') {
                    Some(brace) => {
                        let name = String::from_utf8_lossy(sofar[..brace].strip_prefix(b"call:").unwrap_or(&sofar[..brace])).into_owned();
                        (Phase::Args { name: name.clone(), bytes: sofar[brace..].to_vec() }, CallEvent::Name(name))
                    }
                    None => (Phase::Name(sofar), CallEvent::Markup),
                }
            }
            Phase::Args { name, bytes: sofar } if token == ids.call_close => {
                self.calls += 1;
                let arguments = args_to_json(&sofar).unwrap_or_else(|e| {
                    tracing::warn!("a constrained call's arguments did not parse ({e}): {:?}", String::from_utf8_lossy(&sofar));
                    Value::Null
                });
                (Phase::After, CallEvent::Call { name, arguments })
            }
            Phase::Args { name, bytes: mut sofar } => {
                if token == ids.quote {
                    sofar.push(QUOTE);
                } else {
                    sofar.extend_from_slice(bytes);
                }
                (Phase::Args { name, bytes: sofar }, CallEvent::Markup)
            }
        };
        self.phase = next;
        ev
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_parse_into_json() {
        let src = b"{city:\xffK\xc3\xb8benhavn, DK\xff,days:3,opts:{metric:true,tags:[\xffa\xff,\xffb\xff]},x:null,c:\xff\x01\xff}";
        assert_eq!(args_to_json(src).unwrap(), json!({"city": "København, DK", "days": 3, "opts": {"metric": true, "tags": ["a", "b"]}, "x": null, "c": "\u{1}"}));
        assert!(args_to_json(b"{a:1").is_err() && args_to_json(b"{a:1}x").is_err());
        let deep = [vec![b'['; 200], vec![b']'; 200]].concat();
        assert!(args_to_json(&deep).is_err(), "bounded nesting");
    }

    #[test]
    fn the_tracker_splits_text_from_calls() {
        let ids = ToolTokens { call_open: 48, call_close: 49, response_open: 50, quote: 52 };
        let mut t = CallTracker::new(ids);
        assert_eq!(t.advance(7, b"Ja "), CallEvent::Text);
        assert_eq!(t.advance(48, b""), CallEvent::Markup);
        assert_eq!(t.advance(9, b"call:ad"), CallEvent::Markup);
        assert_eq!(t.advance(10, b"d{a"), CallEvent::Name("add".into()));
        for (tok, b) in [(11u32, &b":1,b:"[..]), (52, b""), (12, b"x y"), (52, b""), (13, b"}")] {
            assert_eq!(t.advance(tok, b), CallEvent::Markup);
        }
        assert_eq!(t.advance(49, b""), CallEvent::Call { name: "add".into(), arguments: json!({"a": 1, "b": "x y"}) });
        assert!(t.after_call() && t.calls == 1);
        assert_eq!(t.advance(50, b""), CallEvent::End);
    }

    #[test]
    fn unsupported_keywords_are_named_with_their_path() {
        let e = args_grammar(&json!({"type": "object", "properties": {"a": {"type": "string", "contentSchema": {}}}}), 52).unwrap_err();
        assert_eq!(e.path, "parameters.properties.a");
        assert!(e.message.contains("contentSchema"), "{e}");
        let e = args_grammar(&json!({"type": "array"}), 52).unwrap_err();
        assert!(e.message.contains("object"), "{e}");
        let e = args_grammar(&json!({"type": "object", "properties": {"a b": {}}}), 52).unwrap_err();
        assert!(e.message.contains("a b"), "{e}");
        assert!(args_grammar(&json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}), 52).is_err());
    }
}
