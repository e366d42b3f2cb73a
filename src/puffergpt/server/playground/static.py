"""The page and the API's docs, as static files: the playground (``/``), how it works
(``/how``), their scripts and styles (``/static``), and Swagger UI and ReDoc from the
fastapi-offline package (no CDN). Every page loads nothing from elsewhere."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse

STATIC = Path(str(resources.files("puffergpt") / "static"))
# The pages load nothing from elsewhere and run no inline script.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
# Set by name: module scripts need a JavaScript type, and some hosts' mimetypes say text/plain.
MEDIA_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".html": "text/html",
               ".svg": "image/svg+xml", ".png": "image/png", ".json": "application/json"}
DOCS_ASSETS = "/docs-assets"  # Swagger UI and ReDoc, from the fastapi-offline package: no CDN

router = APIRouter(include_in_schema=False)


def docs_assets() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def docs_csp(html: str) -> str:
    """The CSP of a docs page: everything from 'self', and its one inline start-up script
    allowed by its hash. Swagger UI and ReDoc set styles as they render, so inline styles
    are allowed (styles run no code); ReDoc's search runs in a worker made from a blob."""
    import base64
    import hashlib
    import re

    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                      for body in re.findall(r"<script>(.*?)</script>", html, re.S))
    return (f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; worker-src 'self' blob:; font-src 'self' data:; object-src 'none'; base-uri 'none'; "
            "frame-ancestors 'none'; form-action 'none'")


def file_in(folder: Path, name: str) -> Path:
    """The file ``name`` right in ``folder``, or a 404. The name is looked up among the
    folder's own entries before the filesystem sees it: a long or odd name (5,000
    characters, a NUL, '..') is only not found, never an OSError."""
    if len(name) > 255 or name not in {p.name for p in folder.iterdir()}:
        raise HTTPException(404, "no such file")
    path = folder / name
    if not path.is_file() or path.resolve().parent != folder.resolve():  # a link out of the folder
        raise HTTPException(404, "no such file")
    return path


def served_file(folder: Path, name: str) -> FileResponse:
    path = file_in(folder, name)
    return FileResponse(path, headers=PAGE_HEADERS, media_type=MEDIA_TYPES.get(path.suffix))


def docs_page(page: HTMLResponse) -> HTMLResponse:
    html = page.body.decode()
    return HTMLResponse(html, headers={**PAGE_HEADERS, "Content-Security-Policy": docs_csp(html)})


@router.get("/")
def index():
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)


@router.get("/how")
def how():
    return FileResponse(STATIC / "how.html", headers=PAGE_HEADERS)


@router.get("/static/{name}")
def static(name: str):
    return served_file(STATIC, name)


@router.get("/docs")
def docs(request: Request):
    from fastapi.openapi.docs import get_swagger_ui_html

    return docs_page(get_swagger_ui_html(openapi_url=request.app.openapi_url, title="puffergpt - Swagger UI",
                                         swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                         swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                         swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png"))


@router.get("/redoc")
def redoc(request: Request):
    from fastapi.openapi.docs import get_redoc_html

    return docs_page(get_redoc_html(openapi_url=request.app.openapi_url, title="puffergpt - ReDoc",
                                    redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                                    redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False))


@router.get(DOCS_ASSETS + "/{name}")
def docs_asset(name: str):
    return served_file(docs_assets(), name)
