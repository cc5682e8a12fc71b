"""The labs, as each states its identity in labs/<lab>/lab.yaml: the one list of labs the scripts
read (cmake/amplab.cmake reads the same files for the build).

A lab.yaml is flat `key: value` lines (comments start with #), so that CMake reads it too:

    name: amp_training          # the lab's folders: labs/, solution/, starter/, apps/, configs/<name>.yaml
    number: 2                   # its place in the course ("Lab 2: ...")
    title: "AMP training, ..."  # what the binary prints first and --help shows
    mechanisms: true            # every lab binary's Trainer runs this lab's code
"""
import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEYS = ("name", "number", "title", "mechanisms")


class LabFileError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class LabInfo:
    name: str
    number: int
    title: str
    mechanisms: bool

    @property
    def full_title(self):
        return f"Lab {self.number}: {self.title}"


def read_lab(path: pathlib.Path) -> LabInfo:
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r'([a-z_]+): *"?([^"]*?)"? *', line)
        if not match or match.group(1) not in KEYS:
            raise LabFileError(f"{path}:{number}: expected one of {', '.join(KEYS)} as 'key: value'")
        values[match.group(1)] = match.group(2)
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise LabFileError(f"{path}: no {', '.join(missing)}")
    if values["name"] != path.parent.name:
        raise LabFileError(f"{path}: name {values['name']} is not its folder's name ({path.parent.name})")
    if not values["number"].isdigit() or values["mechanisms"] not in ("true", "false"):
        raise LabFileError(f"{path}: number must be a whole number and mechanisms true or false")
    return LabInfo(values["name"], int(values["number"]), values["title"], values["mechanisms"] == "true")


def all_labs(root: pathlib.Path = ROOT) -> list:
    """Every lab under labs/, in course order."""
    return sorted((read_lab(p) for p in (root / "labs").glob("*/lab.yaml")), key=lambda lab: lab.number)


def mechanism_labs(root: pathlib.Path = ROOT) -> list:
    """The labs whose code every lab binary's Trainer runs (they are built wherever any lab is)."""
    return [lab.name for lab in all_labs(root) if lab.mechanisms]


if __name__ == "__main__":  # scripts/run.sh --help: the labs, one per line
    for lab in all_labs():
        print(f"  {lab.name:<20} {lab.full_title}")
