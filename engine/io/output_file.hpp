// Writing an output file as a whole, so that a failure never leaves a
// half-written file where the user asked for one.
#pragma once

#include <cstddef>
#include <string>

namespace kvhead::io {

/// The file at `path`, written whole or not at all.
///
/// A regular file (or a name not yet taken) is written through a temporary in
/// the same folder ("<name>.tmp.<pid>.<n>", the name shortened to fit the file
/// system's limit), every write checked, then renamed over `path` by commit();
/// on any failure, or without commit(), the temporary is removed and an
/// existing file at `path` is left untouched. A symbolic link is followed: the
/// file it names is replaced, the link stays. A device, FIFO or socket (say
/// /dev/null or a named pipe) is written in place: renaming over it would
/// replace the node itself (a FIFO that no process is reading is an error,
/// not a hang). (No fsync: atomic against crashes of this process,
/// not against power loss.) Every failure throws file_error naming `path`.
class output_file {
 public:
  explicit output_file(const std::string& path);
  ~output_file();
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;

  void write(const void* buffer, std::size_t size);
  /// Closes (checked: some file systems report write errors only here), then
  /// renames the temporary over the target.
  void commit();

 private:
  [[noreturn]] void fail(const char* what, const std::string& name) const;

  std::string path_;       // as the caller named it, for messages
  std::string target_;     // the file replaced (a link's target)
  std::string temporary_;  // empty when writing in place
  int descriptor_ = -1;
  bool committed_ = false;
};

}  // namespace kvhead::io
