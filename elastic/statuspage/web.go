package statuspage

import (
	"embed"
	"html/template"
	"io/fs"
)

// web holds the page's template and its static files (script, style sheet, icon): everything
// the page loads comes from the binary, so it works on a host with no network.
//
//go:embed web
var web embed.FS

// parseWeb returns the page's templates and its static files.
func parseWeb() (*template.Template, fs.FS, error) {
	t, err := template.ParseFS(web, "web/page.html")
	if err != nil {
		return nil, nil, err
	}
	static, err := fs.Sub(web, "web/static")
	if err != nil {
		return nil, nil, err
	}
	return t, static, nil
}
