// weftctl web: the fleet as a web page (HTML and SVG, no script; docs/web-view.md).
#include "cli/cluster.h"

#include "common/fs.h"

namespace weft::cli {

void add_web_commands(CLI::App& app, Handlers& h) {
  auto file = std::make_shared<std::string>();
  CLI::App* web =
      app.add_subcommand("web",
                         "the fleet as a web page (HTML and SVG, no script) over your certificate; "
                         "docs/web-view.md");
  web->add_option("-o,--output", *file, "write it to this file (default: standard output)");
  h.on(web, [file](const Globals& g) {
    json r = call_or_die(*cp_client(g), "web.page", json::object());
    std::string html = r.value("html", "");
    if (file->empty() || *file == "-") {
      std::cout << html;
      return 0;
    }
    if (auto s = write_file_atomic(*file, html, 0644); !s.ok()) die(s.error().str());
    std::cerr << "weftctl: the fleet's page is in " << *file << "\n";
    return 0;
  });
}

}  // namespace weft::cli
