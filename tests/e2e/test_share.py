"""Shareable links, downloads and presentation mode in a real browser: a lecturer's link opens the Swin page in
presentation mode on the same sample, stage, head and patch; type and charts are larger; a download is a real PNG;
switching presentation mode off takes it out of the link."""
import io
import time

from PIL import Image

from tests.e2e.conftest import assert_healthy, open_page, screenshot, wait_until_idle

LINK = ("swin?presentation=True&swin_sample=astronaut&swin_stage=1&swin_view=Window+attention&swin_head=head+1"
        "&swin_row=3&swin_col=4")
CHART_WIDTHS = """() => Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    .filter(e => e.offsetParent).map(e => {
      const chart = e.querySelector('canvas, svg').getBoundingClientRect().width;
      const column = (e.closest('[data-testid="stColumn"]') || e.parentElement).getBoundingClientRect().width;
      return [chart, column]; })"""


TEXT_SIZE = """() => {
  const body = Array.from(document.querySelectorAll('[data-testid=stMain] [data-testid=stMarkdown] p'))
    .find(p => p.innerText.trim() && !p.closest('[data-testid=stCaptionContainer]'));
  return parseFloat(getComputedStyle(body).fontSize);
}"""


def _text_size(page) -> float:
    """The main area's first paragraph of body text (``st.markdown``: not a widget's label, a tab or a caption)."""
    return float(page.evaluate(TEXT_SIZE))


def test_link_opens_the_figure_in_presentation_mode_and_downloads_work(page, app_url):
    open_page(page, app_url, "swin?swin_sample=astronaut", timeout_s=300)
    normal_size, normal_widths = _text_size(page), page.evaluate(CHART_WIDTHS)

    open_page(page, app_url, LINK, timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "Sample photo 'astronaut'" in body
    assert "stage 2 · block 2 (SW-MSA): where token (3, 4) attends (head 1)" in body  # all from the link
    assert _text_size(page) > normal_size and _text_size(page) >= 18  # the "readable from the back": 18 px
    widths = page.evaluate(CHART_WIDTHS)
    assert all(chart <= column + 1 for chart, column in widths), widths  # zoomed charts never overflow
    assert max(chart for chart, _ in widths) > max(chart for chart, _ in normal_widths)
    screenshot(page, "share-swin-presentation")

    button = page.locator('[data-testid="stDownloadButton"] button:visible').first
    with page.expect_download(timeout=120_000) as info:
        button.click()
    download = info.value
    assert download.suggested_filename.startswith("mini-swin-shapes_sample-astronaut_stage-2-block-2")
    assert Image.open(io.BytesIO(open(download.path(), "rb").read())).format == "PNG"

    page.locator('[data-testid="stExpandSidebarButton"]').click()  # presentation mode tucks the sidebar away
    page.get_by_text("Presentation mode").click()
    wait_until_idle(page)
    time.sleep(1)
    assert "presentation=" not in page.url and "swin_row=3" in page.url
    assert _text_size(page) == normal_size
