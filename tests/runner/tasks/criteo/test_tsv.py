"""The Criteo-format reader: values against a plain-Python parse of the same lines, and every bad input
refused by a message naming the file and the line (or skipped and counted under max_bad_lines)."""
import bz2
import gzip
import math
import random
import re

import numpy as np
import pytest

from runner.tasks.criteo.tsv import COLUMNS, FormatError, Reader, read_blocks


def line(label="1", dense=None, cat=None):
    rnd = random.Random(hash((label, str(dense), str(cat))) & 0xFFFF)
    dense = dense if dense is not None else [str(rnd.randint(-2, 500)) for _ in range(13)]
    cat = cat if cat is not None else [f"{rnd.getrandbits(32):08x}" for _ in range(26)]
    return "\t".join([label, *dense, *cat])


def reference(text: str):
    """A plain-Python reading of the format: (label, dense, cat values, missing) per line."""
    out = []
    for raw in text.splitlines():
        f = raw.split("\t")
        dense = [math.log1p(max(int(x), 0)) if x else 0.0 for x in f[1:14]]
        out.append((int(f[0]), dense, [int(x, 16) if x else 0 for x in f[14:]], [x == "" for x in f[14:]]))
    return out


def write(tmp_path, text, name="train.txt"):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_values_match_a_plain_python_reading(tmp_path):
    rows = [line(str(i % 2)) for i in range(300)]
    rows[5] = line("0", dense=[""] * 13)  # every integer missing
    rows[6] = line("1", cat=[""] * 10 + ["DEADBEEF"] + [f"{i:08x}" for i in range(15)])  # upper-case hex
    rows[7] = line("0", dense=["-7"] * 12 + ["0"])
    text = "\n".join(rows) + "\n"
    blocks = list(read_blocks(write(tmp_path, text), block_bytes=4096))  # many small blocks
    assert len(blocks) > 3
    label = np.concatenate([b.label for b in blocks])
    dense = np.concatenate([b.dense for b in blocks])
    cat = np.concatenate([b.cat for b in blocks])
    missing = np.concatenate([b.missing for b in blocks])
    lines = np.concatenate([b.lines for b in blocks])
    want = reference(text)
    np.testing.assert_array_equal(lines, np.arange(1, 301))
    np.testing.assert_array_equal(label, [w[0] for w in want])
    np.testing.assert_allclose(dense, [w[1] for w in want], rtol=1e-6)
    np.testing.assert_array_equal(cat, [w[2] for w in want])
    np.testing.assert_array_equal(missing, [w[3] for w in want])
    assert cat[6, 10] == 0xDEADBEEF and missing[6, :10].all()


def test_integers_past_64_bits_read_as_log1p_of_their_value(tmp_path):
    """An integer feature is a count of any size: one past int64's range reads as log(1 + x) of its value, a
    negative one of any size as 0."""
    big, neg = "9" * 20, "-" + "9" * 20
    text = line("1", dense=[big, neg, "9223372036854775807"] + ["1"] * 10) + "\n"
    dense = next(iter(read_blocks(write(tmp_path, text)))).dense[0]
    np.testing.assert_allclose(dense[:3], [math.log1p(int(big)), 0.0, math.log1p(2**63 - 1)], rtol=1e-7)


def test_integers_past_a_float64_read_as_log1p_of_their_value(tmp_path):
    """309 digits and more (past float64's largest, about 1.8e308): still log(1 + x), finite, from the digits."""
    huge = ["9" * 309, "1" + "0" * 400, "00" + "12345678901234567890" * 20, "-" + "9" * 400]
    text = line("1", dense=huge + ["1"] * 9) + "\n"
    dense = next(iter(read_blocks(write(tmp_path, text)))).dense[0]
    assert np.isfinite(dense).all()
    want = [math.log(int(x)) if int(x) > 0 else 0.0 for x in huge]  # math.log of a Python int of any size
    np.testing.assert_allclose(dense[:4], want, rtol=1e-6)


def test_gzip_reads_like_plain(tmp_path):
    text = "\n".join(line(str(i % 2)) for i in range(50))  # no newline at the end
    a = np.concatenate([b.cat for b in read_blocks(write(tmp_path, text))])
    b = np.concatenate([b.cat for b in read_blocks(write(tmp_path, text, "day_0.gz"))])
    np.testing.assert_array_equal(a, b)
    assert len(a) == 50


BAD = {
    "fields": (line().rsplit("\t", 1)[0], "line 3: 39 tab-separated fields, a Criteo line has 40"),
    "empty line": ("", "line 3: the line is empty"),
    "label": (line("yes"), "line 3: the label 'yes' is not 0 or 1"),
    "label 2": (line("2"), "line 3: the label '2' is not 0 or 1"),
    "integer": (line(dense=["3"] * 5 + ["4.5"] + ["1"] * 7), "line 3: integer feature int_6 is '4.5', not an integer"),
    "hex": (line(cat=["0000000g"] + ["00000000"] * 25), "line 3: categorical feature cat_1 is '0000000g', not 8 hex digits"),
    "short hex": (line(cat=["00000000"] * 25 + ["abc"]), "line 3: categorical feature cat_26 is 'abc', not 8 hex digits"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_line_is_refused_by_file_and_line(tmp_path, case):
    bad, message = BAD[case]
    path = write(tmp_path, "\n".join([line(), line(), bad, line()]) + "\n")
    with pytest.raises(FormatError) as e:
        list(read_blocks(path))
    assert str(e.value).startswith(f"{path}, {message}")
    assert "--max-bad-lines above 0" in str(e.value)


@pytest.mark.parametrize("case", sorted(BAD))
def test_max_bad_lines_skips_and_counts(tmp_path, case):
    bad, _ = BAD[case]
    rows = [line("1"), bad, line("0"), bad, line("1")]
    reader = Reader(write(tmp_path, "\n".join(rows) + "\n"), max_bad_lines=2)
    blocks = list(reader)
    assert reader.bad_lines == 2 and reader.first_bad.startswith(f"{reader.path}:2: ")
    np.testing.assert_array_equal(np.concatenate([b.lines for b in blocks]), [1, 3, 5])
    np.testing.assert_array_equal(np.concatenate([b.label for b in blocks]), [1, 0, 1])
    with pytest.raises(FormatError, match=r"line 4: .*bad line 2 \(--max-bad-lines 1\)"):
        list(Reader(reader.path, max_bad_lines=1))


def test_empty_and_missing_files_are_refused(tmp_path):
    empty = write(tmp_path, "")
    with pytest.raises(FormatError, match=r"train.txt: the file is empty"):
        list(read_blocks(empty))
    with pytest.raises(FormatError, match=r"nope.txt: no such file"):
        list(read_blocks(tmp_path / "nope.txt"))
    with pytest.raises(FormatError, match=r"day_0.gz: the file has no lines"):
        list(read_blocks(write(tmp_path, "", "day_0.gz")))


def test_a_file_of_wrong_lines_only_is_refused_by_its_first_line(tmp_path):
    """Every line with 41 fields (a tab at each end of line): pyarrow rejects every row, and the first is named."""
    path = write(tmp_path, "".join(line() + "\t\n" for _ in range(50)))
    with pytest.raises(FormatError) as e:
        list(read_blocks(path))
    assert str(e.value).startswith(f"{path}, line 1: 41 tab-separated fields, a Criteo line has 40")
    reader = Reader(path, max_bad_lines=1000)
    assert list(reader) == [] and reader.bad_lines == 50
    with pytest.raises(FormatError, match=r"line 50: 41 tab-separated fields"):  # the last line too
        list(read_blocks(write(tmp_path, "".join(line() + "\n" for _ in range(49)) + line() + "\t\n", "b.txt")))


def test_a_folder_a_gzip_without_gz_a_long_line_and_non_utf8_are_refused_by_what_they_are(tmp_path):
    with pytest.raises(FormatError, match=r"in: a folder; give the Criteo-format files in it"):
        list(read_blocks((tmp_path / "in").mkdir() or tmp_path / "in"))
    zipped = tmp_path / "day_0"
    zipped.write_bytes(gzip.compress(("\n".join(line() for _ in range(5)) + "\n").encode()))
    with pytest.raises(FormatError, match=r"day_0: the file is gzip-compressed, .*rename it to day_0.gz"):
        list(read_blocks(zipped))
    long = write(tmp_path, "\n".join([line(), line(), line(cat=["0" * 9000] + ["00000000"] * 25)]) + "\n", "l.txt")
    with pytest.raises(FormatError, match=r"l.txt: near line 3: a line longer than the reader.s block of 4 KiB"):
        list(read_blocks(long, block_bytes=4096))
    rows = [line().encode() for _ in range(200)]
    rows[1] = rows[1].replace(b"\t", b"\t\xff", 1)  # line 2's first integer starts with a byte UTF-8 has not
    path = tmp_path / "u.txt"
    path.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(FormatError, match=r"u.txt: line 2: not UTF-8 text; a Criteo log is plain text .*fix or "
                                          r"remove the line"):
        list(read_blocks(path))


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("content", [b"caf\xe9\t1\n", bz2.compress(b"0\t1\n" * 500)], ids=["short-line", "bz2"])
def test_bytes_that_are_not_text_on_a_short_line_give_one_message_and_no_traceback(tmp_path, content):
    """A line of the wrong field count that is not UTF-8 either (any binary file: .bz2, a shard): pyarrow cannot
    hand it to the row handler, and its "Exception ignored" traceback is not shown; no byte of it is echoed."""
    path = tmp_path / "b.txt"
    path.write_bytes((("\n".join(line() for _ in range(3)) + "\n").encode() if content[:1] == b"c" else b"") + content)
    with pytest.raises(FormatError) as e:
        list(read_blocks(path))
    assert re.fullmatch(rf"{path}: line \d+: not UTF-8 text; a Criteo log is plain text \(a compressed file other than "
                        r"\.gz, such as \.bz2, \.xz or \.zip, or a converted shard, is not one\): fix or remove the "
                        r"line, or give the log itself", str(e.value)), str(e.value)


def test_a_truncated_gz_is_refused(tmp_path):
    path = write(tmp_path, "\n".join(line(str(i % 2)) for i in range(3000)) + "\n", "day_0.gz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match=r"day_0.gz: the gzip stream ends or breaks near line \d+ .*truncated"):
        list(read_blocks(path, block_bytes=4096))
    with pytest.raises(FormatError, match=r"day_0.gz: the gzip stream ends or breaks within its first 1,024 KiB of "
                                          r"text \(the first block read\) .*truncated"):  # it was "near line 1"
        list(read_blocks(path, block_bytes=1 << 20))


def test_columns_are_the_criteo_layout():
    assert len(COLUMNS) == 40 and COLUMNS[0] == "label" and COLUMNS[13] == "int_13" and COLUMNS[-1] == "cat_26"


BAGS = (3,) + (1,) * 24 + (2,)


def bag_line(rnd, label="1"):
    """A line whose cat_1 holds 0..3 values and cat_26 0..2 (empty: missing), the rest one each."""
    def bag(k):
        return ",".join(f"{rnd.getrandbits(32):08x}" for _ in range(k))
    cat = [bag(rnd.randint(0, 3))] + [bag(1) for _ in range(24)] + [bag(rnd.randint(0, 2))]
    return "\t".join([label, *[str(rnd.randint(0, 9)) for _ in range(13)], *cat])


def test_bags_match_a_plain_python_reading(tmp_path):
    rnd = random.Random(3)
    text = "\n".join(bag_line(rnd, str(i % 2)) for i in range(400)) + "\n"
    blocks = list(read_blocks(write(tmp_path, text), block_bytes=4096, bags=BAGS))
    cat = np.concatenate([b.cat for b in blocks])
    count = np.concatenate([b.count for b in blocks])
    assert cat.shape == (400, 3 + 24 + 2) and count.shape == (400, 26)
    for i, raw in enumerate(text.splitlines()):
        fields = raw.split("\t")[14:]
        for j, (start, size) in ((0, (0, 3)), (25, (27, 2))):
            values = [int(x, 16) for x in fields[j].split(",")] if fields[j] else []
            assert count[i, j] == len(values)
            assert cat[i, start:start + size].tolist() == values + [0] * (size - len(values))
        assert cat[i, 3:27].tolist() == [int(x, 16) for x in fields[1:25]]
    assert {int(c) for c in count[:, 0]} == {0, 1, 2, 3}


@pytest.mark.parametrize("bad, message", [
    ("00000001,00000002,00000003,00000004", "categorical feature cat_1 is '00000001,00000002,00000003,00000004', "
                                            "not 1 to 3 values of 8 hex digits joined by commas (its bag size)"),
    ("00000001;00000002", "categorical feature cat_1 is '00000001;00000002', not 1 to 3 values"),
    ("00000001,", "categorical feature cat_1 is '00000001,', not 1 to 3 values"),
    ("00000001,0000000x", "categorical feature cat_1 is '00000001,0000000x', not 1 to 3 values"),
])
def test_a_bad_bag_is_refused_by_file_and_line(tmp_path, bad, message):
    rnd = random.Random(4)
    fields = bag_line(rnd).split("\t")
    fields[14] = bad
    path = write(tmp_path, "\n".join([bag_line(rnd), "\t".join(fields)]) + "\n")
    with pytest.raises(FormatError) as e:
        list(read_blocks(path, bags=BAGS))
    assert str(e.value).startswith(f"{path}, line 2: {message}")
    with pytest.raises(FormatError, match=r"not 8 hex digits \(a multi-hot feature: set the bag sizes, --bag-sizes "
                                          r"or a run's data.bags\)"):
        list(read_blocks(path))  # read one-hot, a bag is named as one


def bad_lines_of(data: bytes) -> list[int]:
    """A plain-Python reading of which lines are bad: lines end at "\\n" (a "\\r" before it, or as the file's last
    byte, ends the line too), any other "\\r" is part of its line, and no field takes one."""
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    bad = []
    for number, raw in enumerate(pieces, 1):
        f = raw.removesuffix(b"\r").decode().split("\t")
        good = (len(f) == 40 and f[0] in ("0", "1") and all(re.fullmatch(r"-?[0-9]+", x) or x == "" for x in f[1:14])
                and all(re.fullmatch(r"[0-9a-fA-F]{8}", x) or x == "" for x in f[14:]))
        bad += [] if good else [number]
    return bad


@pytest.mark.parametrize("seed", range(3))
def test_bad_lines_over_many_blocks_are_counted_at_their_own_numbers(tmp_path, seed):
    """pyarrow parses a block ahead and refuses a row of the wrong field count as it parses it: such a row of the
    next block was taken for one of the block returned (it raised an IndexError, or numbered lines wrong). Against
    the plain-Python reading: the same bad lines, the lines kept, and the line past the limit named."""
    rnd = random.Random(seed)
    rows = [line(str(i % 2)) for i in range(400)]
    for i in rnd.sample(range(400), 12):
        rows[i] = rnd.choice([rows[i] + "\t", rows[i].rsplit("\t", 1)[0], "", "2" + rows[i][1:]])
    path = write(tmp_path, "\n".join(rows) + "\n")
    want = bad_lines_of(path.read_bytes())
    assert len(want) == 12
    reader = Reader(path, max_bad_lines=12, block_bytes=4096)
    lines = np.concatenate([b.lines for b in reader])
    assert reader.bad_lines == 12 and reader.first_bad.startswith(f"{path}:{want[0]}: ")
    np.testing.assert_array_equal(lines, sorted(set(range(1, 401)) - set(want)))
    for limit in (0, 5, 11):
        with pytest.raises(FormatError) as e:
            list(Reader(path, max_bad_lines=limit, block_bytes=4096))
        assert str(e.value).startswith(f"{path}, line {want[limit]}: ") and e.value.count == limit + 1


def stray_cr(rnd: random.Random, text: str) -> str:
    """``text`` with a "\\r" inside it: anywhere, in place of a tab, or doubled before the line's end."""
    where = rnd.choice(["anywhere", "tab", "end"])
    if where == "tab":
        return text.replace("\t", "\r", 1)
    if where == "end":
        return text + "\r\r"
    at = rnd.randint(0, len(text) - 1)
    return text[:at] + "\r" + text[at:]


@pytest.mark.parametrize("seed", range(4))
def test_a_stray_carriage_return_is_one_bad_line_at_its_own_number(tmp_path, seed):
    """pyarrow ends a line at a lone "\\r" too: a line holding one read as two bad lines and numbered every later
    line one too high. Against the plain-Python reading: the same bad lines, the same kept line numbers, "\\r\\n"
    line ends read as lines (some lines of each file end in "\\r\\n", others in "\\n")."""
    rnd = random.Random(seed)
    rows = [line(str(i % 2)) for i in range(400)]
    for i in rnd.sample(range(400), 12):
        rows[i] = stray_cr(rnd, rows[i])
    data = "".join(r + rnd.choice(["\n", "\r\n"]) for r in rows).encode()
    data = data[:-1] if seed % 2 else data  # a last line ending in "\r" alone, or in its whole line end
    path = tmp_path / "train.txt"
    path.write_bytes(data)
    want = bad_lines_of(data)
    assert len(want) == 12
    reader = Reader(path, max_bad_lines=12, block_bytes=4096)  # many blocks: a "\r\n" split between two reads
    lines = np.concatenate([b.lines for b in reader])
    assert reader.bad_lines == 12
    np.testing.assert_array_equal(lines, sorted(set(range(1, 401)) - set(want)))
    assert re.match(rf"{path}:{want[0]}: a carriage return \(\\r\) inside the line, ", reader.first_bad)
    with pytest.raises(FormatError) as e:
        list(Reader(path, block_bytes=4096))
    assert str(e.value).startswith(f"{path}, line {want[0]}: a carriage return (\\r) inside the line, ")
    with pytest.raises(FormatError, match=rf", line {want[-1]}: a carriage return .*bad line 12 \(--max-bad-lines 11"):
        list(Reader(path, max_bad_lines=11, block_bytes=4096))


@pytest.mark.parametrize("text, where", [
    (line(cat=["0000\r000"] + ["00000000"] * 25), "in categorical feature cat_1; a line ends at \\n (or \\r\\n) only"),
    ("\r" + line(), "in the label;"),
    (line(dense=["1\r2"] + ["1"] * 12), "in integer feature int_1;"),
    (line().replace("\t", "\r", 1), "and 39 tab-separated fields, a Criteo line has 40"),
    (line() + "\r\r", "in categorical feature cat_26;"),
])
def test_a_stray_carriage_return_is_named_by_its_field(tmp_path, text, where):
    path = write(tmp_path, "\r\n".join([line(), text, line()]) + "\r\n")
    with pytest.raises(FormatError) as e:
        list(read_blocks(path))
    assert str(e.value).startswith(f"{path}, line 2: a carriage return (\\r) inside the line, {where}")


LITERAL = "\u240d"  # the character newlines.Lines puts in place of a stray "\r", here in the file itself


ZEROS = ["00000000"] * 26


@pytest.mark.parametrize("stray", [False, True])
@pytest.mark.parametrize("text, why", [
    (line(cat=[LITERAL + "0000000"] + ZEROS[1:]), f"categorical feature cat_1 is '{LITERAL}0000000', not 8 hex digits"),
    (line(dense=[LITERAL] + ["1"] * 12), f"integer feature int_1 is '{LITERAL}', not an integer"),
    (LITERAL + line()[1:], f"the label '{LITERAL}' is not 0 or 1"),
    (line() + "\t" + LITERAL, "41 tab-separated fields, a Criteo line has 40 (the label, 13 integer and 26 "
                               "categorical features); fix"),
    (line(cat=[LITERAL + "0000000", "00\r00000"] + ZEROS[2:]), "a carriage return (\\r) inside the line, in "
                                                               "categorical feature cat_2;"),
])
def test_a_literal_carriage_return_symbol_is_a_bad_value_not_a_carriage_return(tmp_path, stray, text, why):
    """A "␍" the file holds is the invalid value of its field (or part of a line of the wrong field count), named
    as such, whether or not the file also holds a stray "\\r" on another line (which the reader marks with that
    same character); on a line holding both, the "\\r" is named in its own field."""
    other = line(cat=ZEROS[:2] + ["0000\r000"] + ZEROS[3:]) if stray else line()
    path = tmp_path / "train.txt"
    path.write_bytes("\n".join([line(), text, other, line()]).encode() + b"\n")
    with pytest.raises(FormatError) as e:
        list(read_blocks(path))
    assert str(e.value).startswith(f"{path}, line 2: {why}")
    reader = Reader(path, max_bad_lines=2)
    assert sum(len(b) for b in reader) == 4 - reader.bad_lines and reader.bad_lines == 1 + stray


def test_lines_ending_in_a_lone_carriage_return_are_one_line_too_long_named_with_the_fix(tmp_path):
    path = write(tmp_path, "\r".join(line() for _ in range(100)) + "\r", "day_0.gz")
    with pytest.raises(FormatError) as e:
        list(read_blocks(path, block_bytes=4096))
    assert str(e.value).startswith(f"{path}: near line 1: a line longer than the reader's block of 4 KiB")
    assert str(e.value).endswith("only \\n (or \\r\\n) ends a line: if its lines end in \\r alone, convert it "
                                 "(tr '\\r' '\\n')")


@pytest.mark.parametrize("size", [1, 2, 5, 4096])
def test_lines_hand_pyarrow_every_byte_but_a_stray_carriage_return_in_reads_of_any_size(size):
    """A "\\r" ending a read waits for the next byte: before "\\n" it stays, before anything else it is marked."""
    import io

    from runner.tasks.criteo.newlines import MARK, Lines

    rnd = random.Random(size)
    data = bytes(rnd.choice(b"ab\t\r\n") for _ in range(3000)) + b"\r"
    lines, out = Lines(io.BytesIO(data)), b""
    while chunk := lines.read(size):
        assert len(chunk) == size or not lines.read(size)
        out += chunk
    assert out == re.sub(rb"\r(?!\n|\Z)", MARK.encode(), data) and out.endswith(b"\n\r") is data.endswith(b"\n\r")
    assert lines.found and Lines(io.BytesIO(b"a\r\nb\r")).read(-1) == b"a\r\nb\r"
    want, number, tabs = {}, 1, 0  # byte by byte: each line holding a stray "\r", and the field of its first
    for i, byte in enumerate(data):
        if byte == ord("\n"):
            number, tabs = number + 1, 0
        elif byte == ord("\t"):
            tabs += 1
        elif byte == ord("\r") and i + 1 < len(data) and data[i + 1] != ord("\n"):
            want.setdefault(number, tabs)
    assert lines.stray == want and len(want) > 100
