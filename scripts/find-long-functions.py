#!/usr/bin/env python3
"""Lists the C++ functions longer than N lines (default 100), for CI and reviewers.

    scripts/find-long-functions.py src apps               # every .cpp/.hpp/.cu/... under them
    scripts/find-long-functions.py -n 60 src/launcher/main.cpp
    scripts/find-long-functions.py --all src/amplab/data  # every function with its length

A function's length counts the lines from the first line of its declaration (its template<...>
line, if any) to its closing brace. Function bodies are found by brace matching on the text with
comments, string and character literals (raw strings included) blanked, and with only the first
branch of each #if/#else kept. Free functions, member functions (in or out of their class),
constructors with initializer lists, operators, lambdas bound at namespace scope and
GoogleTest's TEST(...) { } bodies count; a lambda or local class inside a function is part of
that function. Exit status: 1 when a function is too long or a file's braces do not balance, 2
on a usage error, 0 otherwise.
No dependencies beyond Python 3.8."""

import argparse
import bisect
import pathlib
import re
import sys

EXTENSIONS = {".cpp", ".cc", ".cxx", ".hpp", ".hh", ".hxx", ".h", ".cu", ".cuh", ".inl"}
CONTROL = {"if", "else", "for", "while", "do", "switch", "try", "catch", "return", "case", "default", "goto", "co_return"}
SCOPE = {"namespace", "extern"}
TYPE_KEYS = {"class", "struct", "union", "enum"}
RAW_PREFIX = re.compile(r"(?<![\w])(?:u8|[uUL])?R$")


class ParseError(Exception):
    pass


def blank(text):
    """`text` with comments and the insides of string and character literals replaced by spaces
    (newlines kept, so that line numbers stay)."""
    out = []
    i, n = 0, len(text)

    def spaces(chunk):
        return re.sub(r"[^\n]", " ", chunk)

    def quoted(quote):  # an ordinary literal from text[i]; returns where it ends
        j = i + 1
        while j < n and text[j] != quote and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        j = min(j, n)
        closed = j < n and text[j] == quote
        out.append(quote + spaces(text[i + 1:j]) + (quote if closed else ""))
        return j + 1 if closed else j

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(spaces(text[i:end]))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(spaces(text[i:end]))
            i = end
        elif c == '"':
            raw = RAW_PREFIX.search(text, max(0, i - 3), i)
            delimiter = re.match(r'"([^()\\\s]{0,16})\(', text[i:i + 20]) if raw else None
            if delimiter:
                close = ")" + delimiter.group(1) + '"'
                body = i + len(delimiter.group(0))
                end = text.find(close, body)
                end = n if end < 0 else end
                out.append(text[i:body] + spaces(text[body:end]) + text[end:end + len(close)])
                i = min(n, end + len(close))
            else:
                i = quoted('"')
        elif c == "'":
            # A digit separator (1'000'000) when the token it is in starts with a digit.
            k = i
            while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_'"):
                k -= 1
            if k < i and text[k].isdigit():
                out.append(c)
                i += 1
            else:
                i = quoted("'")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_preprocessor(text):
    """Blanks preprocessor lines (with their continuations) and every #elif/#else branch, so that
    braces opened differently in two branches do not unbalance the rest."""
    lines = text.split("\n")
    skipping = []  # per open #if: whether the part being read is dropped
    continued = False
    for number, line in enumerate(lines):
        directive = continued or line.lstrip().startswith("#")
        if directive and not continued:
            word = re.match(r"\s*#\s*(\w*)", line).group(1)
            if word in ("if", "ifdef", "ifndef"):
                skipping.append(False)
            elif word in ("elif", "else") and skipping:
                skipping[-1] = True
            elif word == "endif" and skipping:
                skipping.pop()
        continued = directive and line.rstrip().endswith("\\")
        if directive or any(skipping):
            lines[number] = ""
    return "\n".join(lines)


def strip_prefix(header):
    """A declaration without what may come before its first real token: access labels,
    attributes, template<...> heads."""
    while True:
        before = header
        header = re.sub(r"^\s*(public|private|protected)\s*:(?!:)", "", header)
        header = re.sub(r"^\s*\[\[.*?\]\]", "", header, flags=re.S)
        match = re.match(r"\s*template\s*<", header)
        if match:
            depth, k = 1, match.end()
            while k < len(header) and depth:
                depth += {"<": 1, ">": -1}.get(header[k], 0)
                k += 1
            header = header[k:]
        if header == before:
            return header.strip()


def paren_groups(text):
    """[(open, close)] of the parenthesised groups of `text` that are not inside another group or
    a [...] (a lambda's capture, an array bound)."""
    groups, depth, opened = [], 0, None
    for k, ch in enumerate(text):
        if ch in "([":
            if depth == 0 and ch == "(":
                opened = k
            depth += 1
        elif ch in ")]" and depth > 0:
            depth -= 1
            if depth == 0 and ch == ")" and opened is not None:
                groups.append((opened, k))
                opened = None
    return groups


def outside_groups(text):
    """`text` with what is inside (...) and [...] removed."""
    out, depth = [], 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


QUALIFIERS = re.compile(r"(\s*(const|volatile|noexcept|override|final|mutable|constexpr|&&?|->[\w\s:<>,*&]*|"
                        r"requires\b[^{]*))*\s*")


def function_name(header):
    """The name that the declaration before a brace defines as a function, or None when the brace
    opens something else (a namespace, a class, an initializer, a control statement)."""
    core = strip_prefix(header)
    first = re.match(r"[A-Za-z_]\w*", core)
    first = first.group(0) if first else ""
    if not core or first in CONTROL or first in SCOPE:
        return None
    groups = paren_groups(core)
    if first in TYPE_KEYS and not groups:
        return None
    if not groups:  # a lambda without parameters bound at namespace scope: `auto f = [&] {`
        lam = re.search(r"(\w+)\s*=\s*\[[^\]]*\]\s*(mutable\s*)?$", core)
        return f"{lam.group(1)} (lambda)" if lam else None
    # A constructor with an initializer list (its parameters are the group before the ':'), or a
    # function whose last group is its parameters.
    group = next((g for g in groups if re.match(r"\s*(noexcept\s*)?:(?!:)", core[g[1] + 1:])), None)
    if group is None or not core.endswith((")", "}")):
        group = groups[-1] if QUALIFIERS.fullmatch(core[groups[-1][1] + 1:]) else None
    if group is None:
        return None
    before = core[:group[0]].rstrip()
    lam = re.search(r"(\w+)\s*=\s*\[[^\]]*\]$", before)
    if lam:
        return f"{lam.group(1)} (lambda)"
    name = re.search(r"(operator\s*(\(\)|[^\s(]+)|~?[A-Za-z_]\w*(\s*::\s*~?[A-Za-z_]\w*)*)$", before)
    if not name or before.endswith("]"):
        return None  # a lambda inside an expression, or not a declaration
    if re.search(r"(?<![=!<>])=(?!=)", outside_groups(before[:name.start()])):
        return None  # `x = f(...) {`
    name = re.sub(r"\s+", "", name.group(1)) if not name.group(1).startswith("operator") else name.group(1)
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):  # a macro's body: TEST(Suite, Name), TEST_F(...)
        name += re.sub(r"\s+", " ", core[group[0]:group[1] + 1])
    return name


def functions(text):
    """[(name, first line, last line)] of the functions that `text` (C++ source) defines."""
    code = drop_preprocessor(blank(text))
    newlines = [k for k, ch in enumerate(code) if ch == "\n"]

    def line(offset):  # 1-based
        return bisect.bisect_left(newlines, offset) + 1

    found = []
    stack = []        # per open brace outside functions: "scope" (namespace, class) or "expr" (initializer)
    header_start = 0  # where the declaration before the next brace begins
    function = None   # (name, first line, depth of braces inside it) while in a function's body
    for k, ch in enumerate(code):
        if ch not in "{};":
            continue
        if function:
            name, first, depth = function
            depth += {"{": 1, "}": -1}.get(ch, 0)
            function = (name, first, depth)
            if depth == 0:
                found.append((name, first, line(k)))
                function = None
                header_start = k + 1
            continue
        in_expr = bool(stack) and stack[-1] == "expr"
        if ch == ";":
            if not in_expr:
                header_start = k + 1
        elif ch == "{":
            header = code[header_start:k]
            unclosed = header.count("(") - header.count(")") + header.count("[") - header.count("]")
            name = None if in_expr or unclosed > 0 else function_name(header)
            if name:  # it starts at its declaration's first token (an access label is not part of it)
                lead = re.match(r"(\s*(public|private|protected)\s*:(?!:))*\s*", header).end()
                function = (name, line(header_start + lead), 1)
            elif not in_expr and unclosed <= 0 and re.match(
                    r"(inline\s+)?namespace\b|extern\b|(typedef\s+)?(class|struct|union|enum)\b", strip_prefix(header)) \
                    and "=" not in header:
                stack.append("scope")
                header_start = k + 1
            else:
                stack.append("expr")  # an initializer (`= {`, `T x{...}`): the declaration goes on after it
        elif stack:  # "}"
            if stack.pop() == "scope":
                header_start = k + 1
        else:
            header_start = k + 1
    if function or stack:
        what = f"the end of {function[0]} (line {function[1]})" if function else "the end of a namespace or class"
        raise ParseError(f"found no closing brace for {what}: braces unbalanced, or hidden by a macro")
    return found


def source_files(paths):
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in EXTENSIONS and p.is_file())
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 1 when a function is longer than N lines or a file's braces "
                                            "do not balance, 2 on a usage error, else 0.")
    parser.add_argument("paths", nargs="+", help="C++ files, or directories searched for them")
    parser.add_argument("-n", "--max-lines", type=int, default=100, metavar="N",
                        help="longest allowed function, in lines (default 100)")
    parser.add_argument("--all", action="store_true", help="list every function with its length, longest first")
    args = parser.parse_args(argv)
    if args.max_lines < 1:
        parser.error("--max-lines must be at least 1")
    rows = []
    unreadable = 0
    try:
        for path in source_files(args.paths):
            try:
                for name, first, last in functions(path.read_text(errors="replace")):
                    rows.append((last - first + 1, str(path), first, last, name))
            except ParseError as error:
                print(f"{path}: {error}", file=sys.stderr)
                unreadable += 1
    except FileNotFoundError as error:
        print(f"find-long-functions: {error}", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    long_ones = [r for r in rows if r[0] > args.max_lines]
    for length, path, first, last, name in rows if args.all else long_ones:
        print(f"{path}:{first}-{last}: {name}: {length} lines")
    if long_ones:
        print(f"find-long-functions: {len(long_ones)} function(s) longer than {args.max_lines} lines", file=sys.stderr)
    return 1 if long_ones or unreadable else 0


if __name__ == "__main__":
    sys.exit(main())
