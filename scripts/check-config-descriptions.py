#!/usr/bin/env python3
"""Fails when a config key is described twice: by a trailing comment on its member and by its field() text.

A config struct (one with a fields(V& v) method) describes each key once, in the text of its
v.field(), v.choice() or v.section() line: that is what --help and the run directory's config.yaml
print. A trailing `// comment` on such a member says it a second time, and the two drift apart.
Keep the field() text; a note for the code (why the default, how it is used) goes on a comment
line of its own above the member. Members that are no key keep their trailing comments; a member
whose parts are keys (v.field("width", shape.width, ...)) counts as a key.

Scans the C++ headers and sources under src/, apps/, labs/ and solution/. One line per finding,
    file:line: member 'x' is described twice (its comment and its field() text); keep the field() text
and exit 1; nothing and exit 0 when there is none.

    scripts/check-config-descriptions.py [--root DIR] [--skip PATH ...]

--skip takes files or folders (relative to the root, or absolute), and may be given more than once.
"""
import argparse
import pathlib
import re
import sys

FOLDERS = ("src", "apps", "labs", "solution")
SUFFIXES = {".h", ".hh", ".hpp", ".hxx", ".cuh", ".cc", ".cpp", ".cxx", ".cu"}
IDENT = re.compile(r"[A-Za-z_]\w*")
STRUCT = re.compile(r"\b(?:struct|class)\s+(?:alignas\s*\([^()]*\)\s*)?[A-Za-z_]\w*[^;{}()]*\{")
FIELDS_METHOD = re.compile(r"\bfields\s*\([^()]*\)\s*(?:const\s*)?\{")
# v.field("key", member...), v.choice("key", member...), v.section("key", member): string contents
# are blanked by then, so the key is "" of some spaces.
KEY_LINE = re.compile(r"\.\s*(?:field|choice|section)\s*\(\s*\"[^\"\n]*\"\s*,\s*([A-Za-z_]\w*)")
NOT_MEMBERS = re.compile(r"^(?:using|typedef|friend|static_assert|template|struct|class|enum|union|namespace)\b")
NESTED_TYPE = re.compile(r"^(?:struct|class|union|enum)\b")
ACCESS = re.compile(r"^(?:(?:public|private|protected)\s*:\s*)+")
RAW_STRING = re.compile(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\(')


def mask(text):
    """(code, comments): `code` is `text` with comments and the contents of string and character
    literals turned into spaces (newlines, quotes and every offset kept); comments[i] is the
    offset of the `//` comment on line i, when that line has one."""
    out = list(text)
    comments = {}
    line = 0
    i, n = 0, len(text)

    def blank(start, end):
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            comments[line] = i
            blank(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            blank(i, end)
            i = end
        elif c == '"' or (c in "uUL8R" and RAW_STRING.match(text, i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            raw = RAW_STRING.match(text, i)
            if raw:
                close = ")" + raw.group(1) + '"'
                end = text.find(close, raw.end())
                end = n if end < 0 else end + len(close)
                line += text.count("\n", i, end)
                blank(raw.end(), end - len(close))
                i = end
                continue
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        elif c == "'":
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        elif c.isdigit() and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            # A number, with its digit separators (100'000'000): no character literal in it.
            m = re.compile(r"[0-9][0-9A-Za-z_.']*").match(text, i)
            i = m.end()
        elif c.isalpha() or c == "_":
            i = IDENT.match(text, i).end()
        else:
            i += 1
    return "".join(out), comments


def close_brace(code, open_at):
    """Offset of the brace that closes the one at `open_at` (len(code) when none does)."""
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] in "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code)


def statements(code, start, end):
    """The struct body's own statements, code[start:end] at brace depth 0 (nested bodies skipped
    over): (first offset, terminator offset) for each."""
    found = []
    depth = 0
    begin = None
    for k in range(start, end):
        c = code[k]
        if begin is None and not c.isspace() and c != ";":
            begin = k
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
            if depth == 0 and c == "}" and begin is not None:
                rest = code[k + 1:end].lstrip(" \t")
                if not rest.startswith(";") and not rest.startswith(","):  # a function's body, a nested type without a variable
                    found.append((begin, k))
                    begin = None
        elif c == ";" and depth == 0 and begin is not None:
            found.append((begin, k))
            begin = None
    return found


def strip_templates(head):
    previous = None
    while previous != head:
        previous = head
        head = re.sub(r"<[^<>]*>", " ", head)
    return head


def member_names(statement):
    """The data members a declaration at struct scope declares ([] for anything else)."""
    text = ACCESS.sub("", statement.strip())
    if not text or NOT_MEMBERS.match(text) or "operator" in text:
        return []
    # The declarators: split at the commas outside brackets, braces and parentheses.
    pieces, depth, begin = [], 0, 0
    for k, c in enumerate(text):
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        elif c == "," and depth == 0:
            pieces.append(text[begin:k])
            begin = k + 1
    pieces.append(text[begin:])
    names = []
    for index, piece in enumerate(pieces):
        cut = len(piece)
        for k, c in enumerate(piece):
            if c in "={[":
                cut = k
                break
        head = piece[:cut]
        if index == 0:
            head = strip_templates(head)
            if "(" in head or ")" in head or ":" in head.replace("::", ""):  # a function, a constructor, a bit-field
                return []
            words = IDENT.findall(head)
            if len(words) < 2:  # no type before the name (a ctor-like line, a stray word)
                return []
            names.append(words[-1])
        else:
            words = IDENT.findall(head)
            if words:
                names.append(words[-1])
    return [name for name in names if name not in ("const", "constexpr", "static", "mutable", "inline")]


def line_of(text, offset):
    return text.count("\n", 0, offset)


def check_file(path, shown):
    text = path.read_text(encoding="utf-8", errors="replace")
    code, comments = mask(text)
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    findings = []
    for struct in STRUCT.finditer(code):
        body_open = struct.end() - 1
        body_close = close_brace(code, body_open)
        body = code[body_open + 1:body_close]
        # Only this struct's own fields() (a nested struct's is checked on its own).
        stmts = statements(code, body_open + 1, body_close)
        own = [code[a:b + 1] for a, b in stmts]
        fields_bodies = [s for s in own if FIELDS_METHOD.search(s) and not NESTED_TYPE.match(ACCESS.sub("", s.strip()))]
        if not fields_bodies:
            continue
        keyed = {m.group(1) for s in fields_bodies for m in KEY_LINE.finditer(s)}
        if not keyed:
            continue
        for begin, end in stmts:
            names = member_names(code[begin:end])
            described = [name for name in names if name in keyed]
            if not described:
                continue
            # The trailing comment: on the line of the declaration's `;`, after it and after no other code.
            line = line_of(code, end)
            comment = comments.get(line)
            if comment is None:
                continue
            between = code[end + 1:comment]
            if between.strip(" \t;"):
                continue
            findings += [(line + 1, name) for name in described]
    # In the file's order (a nested struct is found after the one around it); each member once.
    findings = sorted(dict.fromkeys(findings), key=lambda finding: finding[0])
    return [f"{shown}:{line}: member '{name}' is described twice (its comment and its field() text); "
            "keep the field() text" for line, name in findings]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent),
                        help="the repository (default: this script's)")
    parser.add_argument("--skip", nargs="+", action="extend", default=[], metavar="PATH",
                        help="files or folders to leave out (relative to the root, or absolute)")
    args = parser.parse_args()
    root = pathlib.Path(args.root).resolve()
    skipped = [(root / s).resolve() if not pathlib.Path(s).is_absolute() else pathlib.Path(s).resolve()
               for s in args.skip]

    def is_skipped(path):
        return any(path == s or s in path.parents for s in skipped)

    problems = []
    for folder in FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file() or is_skipped(path.resolve()):
                continue
            problems += check_file(path, path.relative_to(root).as_posix())
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
