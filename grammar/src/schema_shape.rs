//! Measures of a JSON Schema that bound what compiling it costs — nesting, how deep `$ref`s
//! lead, how wide objects and alternatives are — and the rewrite that keeps local `$ref`s
//! pointing at their definitions when a schema is embedded inside another.
//!
//! Every walk here is iterative: the schemas come from clients, and a deep one must not
//! overflow the stack of the thread measuring it.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// The widest point of a schema: the most properties one object declares, the most
/// alternatives one `anyOf`/`oneOf`/`allOf`/`enum` lists, and the pairs of
/// `patternProperties` the compiler must compare, summed over every object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Breadth {
    pub properties: usize,
    pub alternatives: usize,
    pub pattern_pairs: usize,
}

/// Depth of nested arrays and objects; a scalar is 0.
pub(crate) fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    deepest
}

/// The widest object and list of alternatives anywhere in `schema`.
pub(crate) fn breadth(schema: &Value) -> Breadth {
    let mut widest = Breadth::default();
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    widest.properties = widest.properties.max(properties.len());
                }
                if let Some(Value::Object(patterns)) = map.get("patternProperties") {
                    let n = patterns.len();
                    widest.pattern_pairs = widest
                        .pattern_pairs
                        .saturating_add(n.saturating_mul(n.saturating_sub(1)) / 2);
                }
                for key in ["anyOf", "oneOf", "allOf", "enum"] {
                    if let Some(Value::Array(items)) = map.get(key) {
                        widest.alternatives = widest.alternatives.max(items.len());
                    }
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    widest
}

/// How many `$ref`s deep the longest chain of local references leads from `schema`'s root,
/// counting each reference followed once (a reference back into a definition already on the
/// chain is recursion, which the compiler expands lazily, and ends the chain). Stops counting
/// once it passes `stop_after`, so a hostile schema costs no more than the cap allows.
pub(crate) fn reference_depth(schema: &Value, stop_after: usize) -> usize {
    // The distinct local references inside each subtree, computed once per target.
    let mut refs_inside: HashMap<String, Vec<String>> = HashMap::new();
    let mut depth_of: HashMap<String, usize> = HashMap::new();
    let mut deepest = 0;
    for start in local_refs(schema) {
        // Frames of an explicit depth-first walk: a target and its next child to visit.
        let mut on_chain: HashSet<String> = HashSet::new();
        let mut stack: Vec<(String, usize, usize)> = vec![(start, 0, 0)];
        while let Some((target, next, best)) = stack.pop() {
            if next == 0 {
                if let Some(&known) = depth_of.get(&target) {
                    finish(&mut stack, known);
                    continue;
                }
                if stack.len() >= stop_after || !on_chain.insert(target.clone()) {
                    // Past the cap, or recursion: the chain ends here.
                    let cut = if stack.len() >= stop_after { 1 } else { 0 };
                    finish(&mut stack, cut);
                    continue;
                }
            }
            let children = refs_inside
                .entry(target.clone())
                .or_insert_with(|| resolve(schema, &target).map(local_refs).unwrap_or_default());
            if let Some(child) = children.get(next).cloned() {
                stack.push((target, next + 1, best));
                stack.push((child, 0, 0));
                continue;
            }
            on_chain.remove(&target);
            let depth = best + 1;
            depth_of.insert(target, depth);
            if stack.is_empty() {
                deepest = deepest.max(depth);
            }
            finish(&mut stack, depth);
        }
        if deepest > stop_after {
            break;
        }
    }
    deepest
}

/// Hands a finished child's depth to the frame that visited it.
fn finish(stack: &mut [(String, usize, usize)], depth: usize) {
    if let Some((_, _, best)) = stack.last_mut() {
        *best = (*best).max(depth);
    }
}

/// The distinct local `$ref` targets (`#…`) anywhere under `value`, as JSON pointers.
fn local_refs(value: &Value) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref")
                    && let Some(pointer) = target.strip_prefix('#')
                    && seen.insert(pointer.to_string())
                {
                    out.push(pointer.to_string());
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

fn resolve<'a>(schema: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.is_empty() {
        Some(schema)
    } else {
        schema.pointer(pointer)
    }
}

/// Rewrites every local `$ref` in `schema` (`#/…`, or `#` for the root) to point below
/// `prefix` (a JSON pointer such as `/anyOf/0`), for embedding `schema` there inside a larger
/// one: a tool's parameters with their own `$defs`, as Pydantic writes them, keep resolving.
pub fn rebase_refs(schema: &mut Value, prefix: &str) {
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get_mut("$ref")
                    && let Some(pointer) = target.strip_prefix('#')
                {
                    *target = format!("#{prefix}{pointer}");
                }
                stack.extend(map.values_mut());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    #[test]
    fn a_chain_of_references_is_as_deep_as_it_is_long() {
        assert_eq!(reference_depth(&json!({"type": "string"}), 64), 0);
        assert_eq!(reference_depth(&chain(1), 64), 2);
        assert_eq!(reference_depth(&chain(10), 64), 11);
        // Past the cap the count stops early, but still says "too deep".
        assert!(reference_depth(&chain(600), 64) > 64);
    }

    #[test]
    fn recursion_is_not_depth() {
        let tree = json!({
            "$ref": "#/$defs/node",
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                "self": {"$ref": "#"}
            }}}
        });
        assert_eq!(reference_depth(&tree, 64), 2);
    }

    #[test]
    fn breadth_finds_the_widest_object_and_choice() {
        let schema = json!({"type": "object", "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "integer"}]},
            "b": {"enum": [1, 2]},
            "c": {"type": "object", "patternProperties": {"^x": {}, "^y": {}, "^z": {}}},
            "d": {"type": "object", "patternProperties": {"^x": {}, "^y": {}}}
        }});
        assert_eq!(
            breadth(&schema),
            Breadth {
                properties: 4,
                alternatives: 3,
                pattern_pairs: 3 + 1
            }
        );
    }

    #[test]
    fn rebased_references_resolve_from_the_new_root() {
        let mut params = json!({
            "$defs": {"Inner": {"type": "integer"}},
            "type": "object",
            "properties": {"inner": {"$ref": "#/$defs/Inner"}, "me": {"$ref": "#"},
                           "far": {"$ref": "other.json#/x"}}
        });
        rebase_refs(&mut params, "/properties/arguments");
        let wrapped = json!({"properties": {"arguments": params}});
        let inner = &wrapped["properties"]["arguments"]["properties"]["inner"]["$ref"];
        assert_eq!(inner, "#/properties/arguments/$defs/Inner");
        let target = inner.as_str().unwrap().trim_start_matches('#');
        assert_eq!(wrapped.pointer(target), Some(&json!({"type": "integer"})));
        assert_eq!(
            wrapped["properties"]["arguments"]["properties"]["me"]["$ref"],
            "#/properties/arguments"
        );
        assert_eq!(
            wrapped["properties"]["arguments"]["properties"]["far"]["$ref"],
            "other.json#/x"
        );
    }
}
