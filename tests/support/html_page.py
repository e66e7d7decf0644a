"""A page's elements with their attributes and text, for tests that read the portal's
HTML as a user reads it (by `data-testid`), with nothing but the standard library."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    index: int  # its place in Page.elements; its children follow it up to `end`
    end: int = 0
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join("".join(self.parts).split())


class Page(HTMLParser):
    """Every element of a page with its attributes and text (its children's included)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, len(self.elements))
        self.elements.append(element)
        if tag in VOID:
            element.end = element.index + 1
        else:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            element = self._open.pop()
            element.end = len(self.elements)
            if element.tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.parts.append(data)

    def all(self, **attrs: str) -> list[Element]:
        wanted = {k.rstrip("_").replace("_", "-"): v for k, v in attrs.items()}
        return [e for e in self.elements if all(e.attrs.get(k) == v for k, v in wanted.items())]

    def one(self, **attrs: str) -> Element:
        found = self.all(**attrs)
        assert len(found) == 1, f"{attrs}: {len(found)} elements"
        return found[0]

    def text(self, testid: str) -> str:
        return self.one(data_testid=testid).text

    def rows(self, tag_attr: str) -> dict[str, Element]:
        return {e.attrs[tag_attr]: e for e in self.elements if e.tag == "tr" and tag_attr in e.attrs}


def descendants(page: Page, element: Element) -> list[Element]:
    return page.elements[element.index + 1 : element.end]


def cells(page: Page, row: Element) -> dict[str, str]:
    return {e.attrs["data-testid"]: e.text for e in descendants(page, row) if "data-testid" in e.attrs}
