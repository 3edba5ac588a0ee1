//! Just enough XML for S3's answers: elements, their text, and nothing else that matters.
//!
//! An answer is parsed into a tree of elements whose text is unescaped (`&lt;` `&gt;` `&amp;`
//! `&quot;` `&apos;`, `&#NN;`, `&#xHH;`, and CDATA sections). Attributes are skipped (S3 puts
//! only `xmlns` there); a namespace prefix is dropped from a name. The declaration, comments
//! and processing instructions are skipped. What is not well-formed (an unclosed or mismatched
//! tag, an unknown entity, text outside the root) is an error, never a guess: a key misread is
//! an artifact miscounted.

/// An element: its local name, its text (the concatenation of its text nodes) and its child
/// elements in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Element {
    pub(crate) name: String,
    pub(crate) text: String,
    pub(crate) children: Vec<Element>,
}

impl Element {
    /// The first child named `name`.
    pub(crate) fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child named `name`.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the first child named `name`.
    pub(crate) fn text_of(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }
}

/// Parses a document into its root element.
pub(crate) fn parse(doc: &[u8]) -> Result<Element, String> {
    let doc = std::str::from_utf8(doc).map_err(|_| "the answer is not UTF-8".to_string())?;
    let doc = doc.strip_prefix('\u{feff}').unwrap_or(doc);
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    let mut rest = doc;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            text(&mut stack, rest, root.is_some())?;
            break;
        };
        text(&mut stack, &rest[..lt], root.is_some())?;
        rest = &rest[lt..];
        if let Some(r) = rest.strip_prefix("<?") {
            rest = after(r, "?>")?;
        } else if let Some(r) = rest.strip_prefix("<!--") {
            rest = after(r, "-->")?;
        } else if let Some(r) = rest.strip_prefix("<![CDATA[") {
            let end = r.find("]]>").ok_or("an unclosed CDATA section")?;
            let top = stack.last_mut().ok_or("CDATA outside the root element")?;
            top.text.push_str(&r[..end]);
            rest = &r[end + 3..];
        } else if rest.starts_with("<!") {
            // A DOCTYPE: S3 sends none, and entities it could declare are not expanded.
            return Err("a DOCTYPE is not expected in an S3 answer".into());
        } else if let Some(r) = rest.strip_prefix("</") {
            let end = r.find('>').ok_or("an unclosed end tag")?;
            let name = local(r[..end].trim());
            let done = stack.pop().ok_or("an end tag without its start")?;
            if done.name != name {
                return Err(format!("<{}> closed by </{name}>", done.name));
            }
            close(&mut stack, &mut root, done)?;
            rest = &r[end + 1..];
        } else {
            let r = &rest[1..];
            let end = tag_end(r).ok_or("an unclosed start tag")?;
            let inner = &r[..end];
            let (inner, empty) = match inner.strip_suffix('/') {
                Some(i) => (i, true),
                None => (inner, false),
            };
            let name_end = inner
                .find(|c: char| c.is_whitespace())
                .unwrap_or(inner.len());
            let name = local(&inner[..name_end]);
            if name.is_empty() {
                return Err("a tag without a name".into());
            }
            if root.is_some() {
                return Err("a second root element".into());
            }
            let el = Element {
                name: name.to_string(),
                ..Element::default()
            };
            if empty {
                close(&mut stack, &mut root, el)?;
            } else {
                stack.push(el);
            }
            rest = &r[end + 1..];
        }
    }
    if let Some(open) = stack.last() {
        return Err(format!("<{}> is never closed", open.name));
    }
    root.ok_or_else(|| "no element".into())
}

/// The text after the first `end` in `s`.
fn after<'a>(s: &'a str, end: &str) -> Result<&'a str, String> {
    s.find(end)
        .map(|i| &s[i + end.len()..])
        .ok_or_else(|| format!("no closing {end}"))
}

/// Where a start tag's `>` is, skipping `>` inside quoted attribute values.
fn tag_end(s: &str) -> Option<usize> {
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '>') => return Some(i),
            _ => {}
        }
    }
    None
}

/// A name without its namespace prefix.
fn local(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

/// Appends a finished element to its parent, or makes it the root.
fn close(stack: &mut [Element], root: &mut Option<Element>, el: Element) -> Result<(), String> {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None => *root = Some(el),
    }
    Ok(())
}

/// Text between tags: unescaped into the open element; outside the root only whitespace.
fn text(stack: &mut [Element], raw: &str, after_root: bool) -> Result<(), String> {
    match stack.last_mut() {
        Some(top) => {
            top.text.push_str(&unescape(raw)?);
            Ok(())
        }
        None if raw.trim().is_empty() => Ok(()),
        None if after_root => Err("text after the root element".into()),
        None => Err("text before the root element".into()),
    }
}

/// Resolves the five predefined entities and character references.
pub(crate) fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let r = &rest[amp + 1..];
        let semi = r.find(';').ok_or("an unterminated entity")?;
        let entity = &r[..semi];
        let c = match entity {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(h) = entity
                    .strip_prefix("#x")
                    .or_else(|| entity.strip_prefix("#X"))
                {
                    u32::from_str_radix(h, 16).ok()
                } else if let Some(d) = entity.strip_prefix('#') {
                    d.parse().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| "an unknown entity or character reference".to_string())?
            }
        };
        out.push(c);
        rest = &r[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_parses_into_elements_with_unescaped_text() {
        let doc = br#"<?xml version="1.0" encoding="UTF-8"?>
<!-- a comment -->
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><IsTruncated>true</IsTruncated>
  <Contents><Key>a &amp; b &lt;1&gt; &quot;q&quot; &apos;s&apos; &#233;&#x20AC;</Key><Size>3</Size></Contents>
  <Contents><Key><![CDATA[x<y>&z]]></Key></Contents>
  <s3:Prefix attr="a>b"/>
</ListBucketResult>"#;
        let root = parse(doc).unwrap();
        assert_eq!(root.name, "ListBucketResult");
        assert_eq!(root.text_of("IsTruncated"), Some("true"));
        let keys: Vec<_> = root.all("Contents").filter_map(|c| c.text_of("Key")).collect();
        assert_eq!(keys, ["a & b <1> \"q\" 's' é€", "x<y>&z"]);
        assert_eq!(root.text_of("Prefix"), Some(""));
    }

    #[test]
    fn what_is_not_well_formed_is_refused() {
        for bad in [
            &b"<a><b></a>"[..],
            b"<a>",
            b"<a>&nbsp;</a>",
            b"<a>&amp</a>",
            b"<a></a><b></b>",
            b"text<a></a>",
            b"<!DOCTYPE a [<!ENTITY e \"x\">]><a>&e;</a>",
            b"",
            b"<a><![CDATA[x</a>",
            b"\xff",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
