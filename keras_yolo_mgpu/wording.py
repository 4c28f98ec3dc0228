"""Numbers in the log's sentences: `1 class`, `2 classes`."""


def counted(number: int, plural: str) -> str:
    """`1 box`, `2 boxes`, `1 class`, `1 image listed`: the number and its noun (the first word) in its number."""
    noun, _, rest = plural.partition(" ")
    if number == 1:
        noun = noun[:-2] if noun.endswith(("xes", "sses", "ches", "shes")) else noun[:-1]
    return " ".join(filter(None, (str(number), noun, rest)))
