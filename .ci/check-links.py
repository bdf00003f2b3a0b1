#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown.

For README.md, every docs/*.md and tests/golden/README.md (or the files
given as arguments): every inline link or image `[text](target)` and every
reference definition `[label]: target` outside fenced code blocks and
inline code. A target with a scheme (http:, https:, mailto:, ...) is left
alone; any other must name a file or directory that exists, relative to the
linking file, and its `#anchor`, if any, must be the GitHub slug of a
heading of that Markdown file (the file itself for a bare `#anchor`),
duplicates numbered `-1`, `-2`, ... as GitHub numbers them. A reference
link `[text][label]` must have its definition. Python standard library
only, no network.

Prints `file:line: target: reason` for each broken link and exits 1; with
none, prints a one-line summary and exits 0.
"""

import html
import os
import re
import sys
import unicodedata
import urllib.parse

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
REF_DEF = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# `[text](` with text on one or more lines of one paragraph (no blank line),
# one level of nested brackets allowed (an image inside a link).
_TEXT_CHAR = r"(?:[^\[\]\n]|\n(?![ \t]*\n))"
# A lookahead, so that an image inside a link's text is found too.
INLINE_START = re.compile(r"(?=(!?\[(?:" + _TEXT_CHAR + r"|\[" + _TEXT_CHAR + r"*\])*\]\())")
# `[text][label]` and `[label][]`.
REF_USE = re.compile(r"\[((?:" + _TEXT_CHAR + r"|\[" + _TEXT_CHAR + r"*\])*)\]\[([^\[\]\n]*)\]")


def default_files():
    files = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    if os.path.isdir(docs):
        files += sorted(
            os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md")
        )
    golden = os.path.join(ROOT, "tests", "golden", "README.md")
    if os.path.exists(golden):
        files.append(golden)
    return files


def blank(s):
    """`s` with every character but newlines replaced by a space, so that
    offsets and line numbers stay where they were."""
    return re.sub(r"[^\n]", " ", s)


def strip_code(text):
    """The text with fenced code blocks and inline code spans blanked out."""
    lines = text.split("\n")
    out = []
    fence = None
    for line in lines:
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                out.append(blank(line))
            else:
                out.append(line)
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            out.append(blank(line))
    text = "\n".join(out)
    # Inline code: a run of N backticks up to the next run of exactly N.
    result = []
    i = 0
    n = len(text)
    while i < n:
        if text[i] == "`":
            j = i
            while j < n and text[j] == "`":
                j += 1
            run = text[i:j]
            k = j
            close = -1
            while k < n:
                if text[k] == "`":
                    m = k
                    while m < n and text[m] == "`":
                        m += 1
                    if m - k == len(run):
                        close = k
                        break
                    k = m
                elif text.startswith("\n\n", k):
                    break  # a code span does not cross a paragraph
                else:
                    k += 1
            if close < 0:
                result.append(run)
                i = j
            else:
                end = close + len(run)
                result.append(blank(text[i:end]))
                i = end
        else:
            result.append(text[i])
            i += 1
    return "".join(result)


def heading_text(raw):
    """A heading's text as GitHub renders it: code spans keep their content,
    links and images their text, emphasis markers and HTML tags go."""
    parts = re.split(r"(`+[^`]*`+)", raw)
    out = []
    for part in parts:
        if part.startswith("`"):
            out.append(part.strip("`"))
            continue
        part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)
        part = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", part)
        part = re.sub(r"<[^>]+>", "", part)
        part = re.sub(r"\\(.)", r"\1", part)
        part = re.sub(r"(?<!\w)_+|_+(?!\w)", "", part)
        out.append(part)
    return html.unescape("".join(out)).strip()


def slug(text):
    """github-slugger: lower case, drop everything but letters, marks,
    numbers, connector punctuation, spaces and hyphens; spaces to '-'."""
    kept = []
    for c in text.lower():
        cat = unicodedata.category(c)
        if cat[0] in "LMN" or cat == "Pc" or c in " -":
            kept.append(c)
    return "".join(kept).replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    """Every anchor GitHub gives the Markdown file at `path`."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    # Headings are found on the text with fenced blocks blanked (not inline
    # code: a heading keeps its code spans).
    fenced = []
    fence = None
    for line in lines:
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                fenced.append("")
            else:
                fenced.append(line)
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            fenced.append("")
    occurrences = {}
    found = set()

    def add(title):
        base = slug(heading_text(title))
        result = base
        while result in occurrences:
            occurrences[base] += 1
            result = f"{base}-{occurrences[base]}"
        occurrences[result] = 0
        found.add(result)

    prev = ""
    for line in fenced:
        m = ATX.match(line)
        if m:
            add(m.group(2) or "")
        elif SETEXT.match(line) and prev.strip() and not ATX.match(prev) \
                and not prev.lstrip().startswith(("|", ">", "- ", "* ", "+ ")):
            add(prev.strip())
        for a in HTML_ANCHOR.findall(line):
            found.add(a)
        prev = line
    _anchor_cache[path] = found
    return found


def parse_target(text, start):
    """The link destination that starts at `start` (just after `](`), up to
    its closing parenthesis; None if it never closes."""
    i = start
    n = len(text)
    while i < n and text[i] in " \t\n":
        i += 1
    if i < n and text[i] == "<":
        end = text.find(">", i)
        if end < 0:
            return None
        dest = text[i + 1:end]
        close = text.find(")", end)
        return dest if close >= 0 else None
    depth = 0
    j = i
    while j < n:
        c = text[j]
        if c == "\\" and j + 1 < n:
            j += 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif c in " \t\n":
            break  # a title may follow
        j += 1
    if j >= n:
        return None
    return text[i:j]


def check(source, target, line, problems, counts):
    counts["links"] += 1
    if target == "":
        problems.append(f"{source}:{line}: (empty): empty link target")
        return
    if SCHEME.match(target):
        return
    counts["relative"] += 1
    path, _, fragment = target.partition("#")
    path = path.split("?", 1)[0]
    path = urllib.parse.unquote(path)
    fragment = urllib.parse.unquote(fragment)
    if path == "":
        dest = source
    elif path.startswith("/"):
        dest = os.path.join(ROOT, path.lstrip("/"))
    else:
        dest = os.path.normpath(os.path.join(os.path.dirname(source), path))
    shown = os.path.relpath(source, ROOT)
    if not os.path.exists(dest):
        problems.append(f"{shown}:{line}: {target}: {os.path.relpath(dest, ROOT)} does not exist")
        return
    if "#" not in target:
        return
    if not dest.endswith(".md") or not os.path.isfile(dest):
        problems.append(f"{shown}:{line}: {target}: an anchor into {os.path.relpath(dest, ROOT)}, which is not a Markdown file")
        return
    if fragment not in anchors(dest):
        problems.append(f"{shown}:{line}: {target}: no heading of {os.path.relpath(dest, ROOT)} has the anchor #{fragment}")


def normalize_label(label):
    return re.sub(r"\s+", " ", label.strip()).lower()


def check_file(source, problems, counts):
    with open(source, encoding="utf-8") as f:
        raw = f.read()
    # Escaped brackets and parentheses are not link syntax.
    text = re.sub(r"\\[\[\]()]", "  ", strip_code(raw))

    def line_of(offset):
        return text.count("\n", 0, offset) + 1

    definitions = set()
    for n, line in enumerate(text.split("\n"), start=1):
        m = REF_DEF.match(line)
        if m:
            definitions.add(normalize_label(m.group(1)))
            dest = m.group(2)
            if dest.startswith("<") and dest.endswith(">"):
                dest = dest[1:-1]
            check(source, dest, n, problems, counts)
    for m in INLINE_START.finditer(text):
        if text.startswith("[", m.start()) and text[m.start() - 1:m.start()] == "!":
            continue  # the same image, found from its `!`
        target = parse_target(text, m.end(1))
        if target is None:
            continue
        check(source, target, line_of(m.end(1)), problems, counts)
    for m in REF_USE.finditer(text):
        label = m.group(2) if m.group(2).strip() else m.group(1)
        if normalize_label(label) not in definitions:
            counts["links"] += 1
            shown = os.path.relpath(source, ROOT)
            problems.append(f"{shown}:{line_of(m.start())}: [{label}]: no definition of this reference")


def main(argv):
    files = [os.path.abspath(a) for a in argv[1:]] or default_files()
    problems = []
    counts = {"links": 0, "relative": 0}
    for source in files:
        check_file(source, problems, counts)
    for p in problems:
        print(p)
    if problems:
        print(f"links: {len(problems)} broken of {counts['links']} in {len(files)} files", file=sys.stderr)
        return 1
    print(f"links: {counts['links']} in {len(files)} files, {counts['relative']} relative, none broken")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
