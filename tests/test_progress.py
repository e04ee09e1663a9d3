import io

import pytest

from course_lib.instruments import progress


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_plain_lines_when_not_a_terminal_no_carriage_return():
    stream, clock = io.StringIO(), FakeClock()
    with progress.Progress(18, "grid", unit="fits", stream=stream, interval=10, clock=clock) as bar:
        assert bar.plain  # a StringIO is not a terminal
        for fit in range(18):
            bar.set_postfix_str(f"fit {fit}")
            clock.now += 3
            bar.update()
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "grid: 18 fits, started"
    # 3 s per fit, a line at most every 10 s: after fits 4, 8, 12 and 16, then the end line.
    assert lines[1] == "grid: 4/18 fits (22%), 12 s, about 42 s left; fit 3"
    assert len(lines) == 6 and lines[-1] == "grid: 18/18 fits (100%), 54 s, done"


def test_an_inner_bar_is_quiet_when_short_and_closes_its_lines_when_long():
    stream, clock = io.StringIO(), FakeClock()
    with progress.Progress(5, "epoch 1/3", stream=stream, leave=False, interval=10, clock=clock) as bar:
        for _ in range(5):
            clock.now += 1
            bar.update()
    assert stream.getvalue() == ""  # 5 s: nothing to say
    with progress.Progress(5, "epoch 2/3", stream=stream, leave=False, interval=10, clock=clock) as bar:
        bar.set_postfix(loss="1.234", lr="0.1")
        for _ in range(5):
            clock.now += 4
            bar.update()
    assert stream.getvalue().splitlines() == ["epoch 2/3: 3/5 (60%), 12 s, about 8 s left; loss 1.234, lr 0.1",
                                              "epoch 2/3: 5/5 (100%), 20 s, done"]


def test_without_a_total_the_count_and_time_are_shown():
    stream, clock = io.StringIO(), FakeClock()
    bar = progress.Progress(None, "PNG files", unit="images", stream=stream, interval=0, clock=clock)
    clock.now += 2
    bar.update(120)
    bar.close()
    bar.close()  # twice: one end line
    assert stream.getvalue().splitlines() == ["PNG files: started", "PNG files: 120 images, 2 s",
                                              "PNG files: 120 images, 2 s, done"]


def test_disabled_shows_nothing():
    stream = io.StringIO()
    assert list(progress.track(range(3), "seeds", stream=stream, enabled=False, interval=0)) == [0, 1, 2]
    assert stream.getvalue() == ""


def test_track_counts_an_iterable():
    stream = io.StringIO()
    assert list(progress.track(["a", "b"], "seeds", unit="seeds", stream=stream, interval=0, clock=FakeClock())) \
        == ["a", "b"]
    assert stream.getvalue().splitlines() == ["seeds: 2 seeds, started", "seeds: 1/2 seeds (50%), 0 s",
                                              "seeds: 2/2 seeds (100%), 0 s", "seeds: 2/2 seeds (100%), 0 s, done"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_tqdm_bar():
    stream = Terminal()
    with progress.Progress(3, "seeds", stream=stream) as bar:
        assert not bar.plain and bar.bar is not None
        bar.update(3)
    assert "\r" in stream.getvalue() and "3/3" in stream.getvalue()


def test_outside_a_kernel_it_is_not_a_notebook():
    assert not progress.in_notebook()


def test_bytes_are_shown_in_mebibytes_from_where_a_resumed_download_starts():
    stream, clock = io.StringIO(), FakeClock()
    with progress.Progress(8 * 2**20, "EuroSAT.zip", in_bytes=True, initial=2 * 2**20, stream=stream, interval=5,
                           clock=clock) as bar:
        for _ in range(6):
            clock.now += 3
            bar.update(2**20)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "EuroSAT.zip: 8.0 MiB, started"
    assert lines[1] == "EuroSAT.zip: 4.0/8.0 MiB (50%), 6 s, about 12 s left"  # 2 MiB in 6 s, 4 to go
    assert lines[-1] == "EuroSAT.zip: 8.0/8.0 MiB (100%), 18 s, done"


def test_a_delayed_bar_stays_hidden_for_a_short_call():
    stream = Terminal()
    assert list(progress.track(range(3), "predicting", stream=stream, leave=False, delay=60)) == [0, 1, 2]
    assert "predicting" not in stream.getvalue()


def test_track_over_an_iterable_without_a_length():
    stream = io.StringIO()
    items = (i for i in range(3))
    assert list(progress.track(items, "stream", stream=stream, interval=0, clock=FakeClock())) == [0, 1, 2]
    assert stream.getvalue().splitlines()[-1] == "stream: 3, 0 s, done"


@pytest.mark.slow
def test_a_notebooks_saved_bars_are_text_not_widgets(tmp_path):
    """Issue 50 point 4: a reopened notebook showed 108 "Error displaying widget: model not found" (the
    bars' widgets, whose state the file lacks). Executed in a real kernel, each bar's output ends as its
    plain final line (the inner bars share one output, left empty), and the saved file holds no widget view."""
    import nbformat
    from nbclient import NotebookClient

    code = ("from course_lib.instruments import progress\n"
            "for epoch in progress.track(range(3), 'epochs', unit='epochs'):\n"
            "    for step in progress.track(range(4), 'steps', leave=False):\n"
            "        pass\n"
            "delayed = progress.Progress(2, 'predicting', leave=False, delay=0.01)\n"
            "import time; time.sleep(0.05); delayed.update(2); delayed.close()\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    saved = tmp_path / "saved.ipynb"
    nbformat.write(notebook, saved)
    assert "application/vnd.jupyter.widget-view+json" not in saved.read_text()
    texts = [output.get("data", {}).get("text/plain") for output in notebook.cells[0].outputs]
    assert texts[0].startswith("'epochs: 3/3 epochs (100%)") or texts[0].startswith("epochs: 3/3 epochs (100%)")
    assert texts[0].rstrip("'").endswith("done") and texts[1:] == [""]  # 3 epochs' bars and the delayed one
