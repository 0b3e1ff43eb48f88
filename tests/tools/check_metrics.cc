// check_metrics FILE KEY>=VALUE | KEY<=VALUE ...: checks fields of the summary line
// (the last line) of a metrics file. Exits 0 when every condition holds.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace {

bool fieldOf(const std::string& line, const std::string& key, double* value) {
  const std::string needle = "\"" + key + "\": ";
  const size_t at = line.find(needle);
  if (at == std::string::npos) return false;
  const char* start = line.c_str() + at + needle.size();
  char* end = nullptr;
  *value = std::strtod(start, &end);
  return end != start;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: check_metrics FILE KEY>=VALUE|KEY<=VALUE...\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::string line, last;
  int lines = 0;
  while (std::getline(in, line)) {
    if (!line.empty()) {
      last = line;
      ++lines;
    }
  }
  if (last.find("\"summary\": true") == std::string::npos) {
    std::fprintf(stderr, "check_metrics: %s has no summary line (%d lines)\n", argv[1], lines);
    return 1;
  }
  int failed = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string cond = argv[i];
    const size_t ge = cond.find(">=");
    const size_t le = cond.find("<=");
    const bool greater = ge != std::string::npos;
    const size_t op = greater ? ge : le;
    if (op == std::string::npos) {
      std::fprintf(stderr, "check_metrics: bad condition '%s'\n", cond.c_str());
      return 2;
    }
    const std::string key = cond.substr(0, op);
    const double bound = std::atof(cond.c_str() + op + 2);
    double value = 0;
    if (!fieldOf(last, key, &value)) {
      std::printf("FAIL %s: no field '%s' in the summary\n", cond.c_str(), key.c_str());
      ++failed;
      continue;
    }
    const bool ok = greater ? value >= bound : value <= bound;
    std::printf("%s %s: %s = %g\n", ok ? "ok" : "FAIL", cond.c_str(), key.c_str(), value);
    failed += ok ? 0 : 1;
  }
  std::printf("%d lines checked\n", lines);
  return failed == 0 ? 0 : 1;
}
