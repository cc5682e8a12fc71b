"""The labs, as each states its identity in labs/<lab>/lab.yaml: the one list of labs the scripts
read (cmake/amplab.cmake reads the same files for the build).

A lab.yaml is flat `key: value` lines (comments start with #), so that CMake reads it too:

    name: amp_training          # the lab's folders: labs/, solution/, starter/, apps/, configs/<name>.yaml
    number: 2                   # its place in the course ("Lab 2: ...")
    title: "AMP training, ..."  # what the binary prints first and --help shows
    mechanisms: true            # the trainer's step is this lab's code (src/amplab/train/step.hpp)
    trains: true                # optional: its binary and tests train through the core's Trainer, so
                                # they link the mechanism labs' code (default false)
    ranks: 2                    # optional: scripts/run.sh starts this many ranks (amplab-run), one per
                                # GPU where there are GPUs (at most as many as there are), else CPU ranks
"""
import dataclasses
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEYS = ("name", "number", "title", "mechanisms")
OPTIONAL_KEYS = ("ranks", "trains")


class LabFileError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class LabInfo:
    name: str
    number: int
    title: str
    mechanisms: bool
    ranks: int = 1
    trains: bool = False

    @property
    def full_title(self):
        return f"Lab {self.number}: {self.title}"


def read_lab(path: pathlib.Path) -> LabInfo:
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r'([a-z_]+): *"?([^"]*?)"? *', line)
        if not match or match.group(1) not in KEYS + OPTIONAL_KEYS:
            raise LabFileError(f"{path}:{number}: expected one of {', '.join(KEYS + OPTIONAL_KEYS)} as 'key: value'")
        values[match.group(1)] = match.group(2)
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise LabFileError(f"{path}: no {', '.join(missing)}")
    if values["name"] != path.parent.name:
        raise LabFileError(f"{path}: name {values['name']} is not its folder's name ({path.parent.name})")
    if not values["number"].isdigit() or values["mechanisms"] not in ("true", "false") or \
            values.get("trains", "false") not in ("true", "false"):
        raise LabFileError(f"{path}: number must be a whole number, mechanisms and trains true or false")
    ranks = values.get("ranks", "1")
    if not ranks.isdigit() or int(ranks) < 1:
        raise LabFileError(f"{path}: ranks must be a whole number of at least 1, not {ranks!r}")
    return LabInfo(values["name"], int(values["number"]), values["title"], values["mechanisms"] == "true", int(ranks),
                   values.get("trains", "false") == "true")


def all_labs(root: pathlib.Path = ROOT) -> list:
    """Every lab under labs/ (each folder there must have its lab.yaml, as the build requires), in
    course order. Raises LabFileError naming the file."""
    labs = []
    for folder in sorted(p for p in (root / "labs").iterdir() if p.is_dir()):
        if not (folder / "lab.yaml").is_file():
            raise LabFileError(f"{folder / 'lab.yaml'} is missing: every lab states its name, number, title and "
                               "mechanisms there")
        labs.append(read_lab(folder / "lab.yaml"))
    return sorted(labs, key=lambda lab: lab.number)


def labs_or_exit(root: pathlib.Path = ROOT) -> list:
    """all_labs() for a script: a missing or broken lab.yaml is one line and exit 2."""
    try:
        return all_labs(root)
    except (LabFileError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def mechanism_labs(root: pathlib.Path = ROOT) -> list:
    """The labs whose code is the trainer's step (built wherever a lab that trains is)."""
    return [lab.name for lab in labs_or_exit(root) if lab.mechanisms]


def linked_mechanism_labs(lab: str, root: pathlib.Path = ROOT) -> list:
    """The mechanism labs whose code `lab`'s binary and tests link: every one when it trains (or is
    one), none otherwise."""
    info = {l.name: l for l in labs_or_exit(root)}
    return mechanism_labs(root) if lab in info and (info[lab].trains or info[lab].mechanisms) else []


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ranks":  # scripts/run.sh: how many ranks LAB starts
        print(next((lab.ranks for lab in labs_or_exit() if lab.name == sys.argv[2]), 1))
    else:  # scripts/run.sh --help: the labs, one per line
        for lab in labs_or_exit():
            print(f"  {lab.name:<20} {lab.full_title}")
